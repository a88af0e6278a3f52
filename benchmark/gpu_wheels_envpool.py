"""EnvPool's Atari part, out of its wheels (benchmark/gpu_wheels.sh): 4 MB compressed instead of 250.

    python benchmark/gpu_wheels_envpool.py WHEEL_DIR TREE_DIR

Keeps envpool's own Python files, ``envpool/python``, ``envpool/atari`` (``atari_envpool.so``),
``envpool.libs`` and ``envpool_assets`` with its Atari ROMs only, and writes an ``envpool/entry.py``
that registers the Atari games alone (the full one imports every env family).
"""

import re
import stat
import sys
import zipfile
from pathlib import Path

KEEP = re.compile(
    r"envpool/[^/]+\.py|envpool/(python|atari)/[^/]+|envpool\.libs/.+|envpool_assets/(__init__\.py|atari/.+)"
)


def main() -> None:
    wheels, tree = Path(sys.argv[1]), Path(sys.argv[2])
    found = sorted(wheels.glob("envpool-*.whl")) + sorted(wheels.glob("envpool_assets-*.whl"))
    if len(found) != 2:
        raise SystemExit(f"error: {wheels}: needs one envpool and one envpool_assets wheel, found {found}")
    for wheel in found:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tree, [name for name in z.namelist() if KEEP.fullmatch(name)])
    (tree / "envpool/entry.py").write_text(
        '"""Entry point of an Atari-only EnvPool tree (benchmark/gpu_wheels.sh)."""\n\n'
        "import envpool.atari.registration  # noqa: F401\n"
    )
    for library in [*tree.glob("envpool/atari/*.so"), *tree.glob("envpool.libs/*")]:
        library.chmod(library.stat().st_mode | stat.S_IXUSR)  # zip files do not keep the mode bits
    print(f"{tree}: {sum(1 for p in tree.rglob('*') if p.is_file())} files")


if __name__ == "__main__":
    main()
