/* SPDX-License-Identifier: MIT */
/* Links against an installed kiln::kiln_cuda (tests/install_test.sh); built, not run. */
#include <kiln/kiln_cuda.h>
#include <stdio.h>

int main(void)
{
	kiln_pin_hooks h;
	kiln_cuda_pin_hooks(&h);
	printf("%s\n", h.pin && h.unpin ? "hooks" : "none");
	return 0;
}
