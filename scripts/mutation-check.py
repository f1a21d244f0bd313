#!/usr/bin/env python3
"""Remove each rule of the validator in turn and check that the test suites notice.

For every `if (COND)` in src/format/klnt.c (the KLNT reader) whose body (its block or its one
statement) rejects a block (a kiln__fail, kiln__fail_desc or kiln__fail_at call), build a copy of the tree with that
condition replaced by `0 && (COND)` and run the rules, golden and writer suites. A mutation
that every suite survives is a rule no test pins down. Slow (a build per rule), so it is a
developer's check, not part of scripts/test.sh.

usage: scripts/mutation-check.py [BUILD_DIR]   (default /tmp/kiln-mutation)
"""
import os, re, shutil, subprocess, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/kiln-mutation"
src = os.path.join(work, "src")
build = os.path.join(work, "build")

shutil.rmtree(src, ignore_errors=True)
shutil.copytree(root, src, ignore=shutil.ignore_patterns("build*", ".git"))
subprocess.run(["cmake", "-S", src, "-B", build, "-DKILN_BUILD_BENCH=OFF", "-DKILN_CUDA=OFF"],
               check=True, stdout=subprocess.DEVNULL)
suites = ["test_rules", "test_golden", "test_writer"]

path = os.path.join(src, "src", "format", "klnt.c")
original = open(path).read()
lines = original.split("\n")


def body(i, braced):
    """The lines the `if` on line i governs: its block, or its one statement."""
    out, depth = [], 1
    for line in lines[i + 1:]:
        out.append(line)
        if braced:
            depth += line.count("{") - line.count("}")
            if depth <= 0:
                break
        elif line.rstrip().endswith(";"):
            break
    return "\n".join(out)


sites = []
for i, line in enumerate(lines):
    m = re.match(r"^(\s*)(\} else )?if \((.*)\)( \{)?$", line)
    if not m:
        continue
    if re.search(r"\bkiln__fail(_desc|_at)?\(", body(i, bool(m.group(4)))):
        sites.append(i)

survivors = []
for n, i in enumerate(sites, 1):
    mutated = list(lines)
    mutated[i] = re.sub(r"if \((.*)\)", r"if (0 && (\1))", lines[i], count=1)
    open(path, "w").write("\n".join(mutated))
    ok = subprocess.run(["cmake", "--build", build, "-j1", "--target"] + suites,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    if not ok:
        print(f"{n:3}/{len(sites)} line {i + 1:4}: BUILD FAILED: {lines[i].strip()}", flush=True)
        survivors.append(i + 1)
        continue
    caught = False
    for s in suites:
        r = subprocess.run([os.path.join(build, "tests", s), "--jobs", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode != 0:
            caught = True
            break
    print(f"{n:3}/{len(sites)} line {i + 1:4}: {'caught' if caught else 'SURVIVED'}: "
          f"{lines[i].strip()}", flush=True)
    if not caught:
        survivors.append(i + 1)
open(path, "w").write(original)
print(f"{len(sites) - len(survivors)} of {len(sites)} rules removed were caught by a test")
if survivors:
    print("not caught (or did not build) at lines:", survivors)
sys.exit(1 if survivors else 0)
