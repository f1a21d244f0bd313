#include <criterion/criterion.h>
Test(x, placeholder) { cr_assert(1); }
