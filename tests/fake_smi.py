"""A faked `nvidia-smi` for tests: the real table layout (R580) and query answers of a few machines."""
from __future__ import annotations

from pathlib import Path


def smi_table(driver: str, cuda: str, name: str) -> str:
    """The head of a real `nvidia-smi` table (R580 layout)."""
    return (f"Mon Dec  1 10:00:00 2025\n"
            f"+-----------------------------------------------------------------------------------------+\n"
            f"| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |\n"
            f"+-----------------------------------------+------------------------+----------------------+\n"
            f"| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n"
            f"|   0  {name:<30} On  |   0000000F:01:00.0  On |                  N/A |\n")


GB10 = (smi_table("580.95.05", "13.0", "NVIDIA GB10"), "NVIDIA GB10, 12.1\n")
H100_CUDA12 = (smi_table("550.54.15", "12.4", "NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3, 9.0\n")
T4_OLD = (smi_table("470.182.03", "11.4", "Tesla T4"), None)  # R470 knows no compute_cap field


def fake_smi(folder: Path, table: str, query: str | None, rc: int = 0) -> Path:
    """An executable `nvidia-smi`: `table` without arguments (exit code `rc`), `query` for
    --query-gpu=name,compute_cap; with query None that field fails as on R470, and the name comes
    from the table's GPU line."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.txt").write_text(table)
    name = next((line.split("|")[1].split()[1:-1] for line in table.splitlines() if line.startswith("|   0")), [])
    (folder / "name.txt").write_text(" ".join(name) + "\n")
    cc = f'cat "{folder}/query.txt"' if query is not None else \
        'echo \'Field "compute_cap" is not a valid field to query.\'; exit 2'
    (folder / "query.txt").write_text(query or "")
    script = folder / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=name,compute_cap) {cc} ;;
  --query-gpu=name) cat "{folder}/name.txt" ;;
  *) cat "{folder}/table.txt"; exit {rc} ;;
esac
""")
    script.chmod(0o755)
    return script
