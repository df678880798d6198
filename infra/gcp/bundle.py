"""The Cloud Functions source zip: functions/gcp/main.py as main.py, infra/gcp/requirements.txt, and the
jobplane package as shipped on GCP (jobplane.boot.bundling.shipped: no AWS adapter, no CLI, no local cloud or fake).
Deterministic (sorted entries, fixed times), so the same sources give the same zip and the same object name
in terraform (its content hash), and an unchanged deployment is not rebuilt.

    python -m infra.gcp.bundle build/gcp-functions.zip      (make gcp-functions-zip)
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from jobplane.boot import bundling

ROOT = Path(__file__).resolve().parents[2]
STAMP = (2020, 1, 1, 0, 0, 0)


def members() -> dict[str, Path]:
    """Name in the zip -> file."""
    files = {"main.py": ROOT / "functions" / "gcp" / "main.py", "requirements.txt": ROOT / "infra" / "gcp" /
             "requirements.txt"}
    files.update({f"jobplane/{p.relative_to(bundling.PACKAGE).as_posix()}": p for p in bundling.package_files("gcp")})
    return files


def functions_zip(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, path in sorted(members().items()):
            info = zipfile.ZipInfo(name, STAMP)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    tmp.replace(out)
    return out


if __name__ == "__main__":
    print(functions_zip(Path(sys.argv[1] if len(sys.argv) > 1 else "build/gcp-functions.zip")))
