"""Make a catalog of many env types (1,000 by default) from the bundled and AWM-1K sample envs.

Each servable env of the sources (the bundled catalog, plus any AWM folder given with
``--source``, e.g. a few AWM-1K envs) is cloned under new names (``<name>__c<k>``) with all its AWM records
(scenario, tasks, schema, data, spec, code, verifiers), round-robin until ``--types`` types
exist, so a farm can be tried at AWM-1K scale here. ``--broken N`` makes N of them fail to load
(their code raises at import), as real catalogs have. The output is generated: never commit it.

    .venv/bin/python -m tests.fakes.catalog_1k --out /tmp/catalog_1k [--types 1000]
        [--source DIR ...] [--broken 1]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from envfarm.catalog import AWM_FILES, BUNDLED_CATALOG, load_catalog, normalize_name

_BROKEN_CODE = "raise RuntimeError('this env is broken on purpose (catalog_1k --broken)')\n"


def _folders(source: Path) -> list[Path]:
    found = [source] + sorted(p for p in source.iterdir() if p.is_dir())
    return [f for f in found if any((f / name).is_file() for name in AWM_FILES)]


def _records(sources: list[Path]) -> dict[str, dict[str, list[dict]]]:
    """servable env name -> AWM file -> its records (as they are on disk)."""
    servable = {name for s in sources for name in load_catalog(s).servable}
    out: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for source in sources:
        for folder in _folders(source):
            for file in AWM_FILES:
                path = folder / file
                if not path.is_file():
                    continue
                for line in path.read_text().splitlines():
                    if line.strip():
                        record = json.loads(line)
                        name = normalize_name(record.get("scenario", record.get("name", "")))
                        if name in servable:
                            out[name][file].append(record)
    return out


def make_catalog(out: Path, types: int = 1000, sources: list[Path] | None = None,
                 broken: int = 0) -> list[str]:
    """Write the catalog into ``out`` (one AWM folder); returns the type names, broken last."""
    sources = sources or [BUNDLED_CATALOG]
    originals = _records(sources)
    if not originals:
        raise SystemExit(f"no servable env in {', '.join(map(str, sources))}")
    bases = sorted(originals)
    out.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[str]] = defaultdict(list)
    names = []
    for i in range(types):
        base = bases[i % len(bases)]
        name = f"{base}__c{i:04d}"
        names.append(name)
        for file, records in originals[base].items():
            for record in records:
                clone = dict(record)
                clone["scenario" if "scenario" in clone else "name"] = name
                if file == "gen_envs.jsonl" and i >= types - broken:
                    clone["full_code"] = _BROKEN_CODE
                lines[file].append(json.dumps(clone))
    for file, rows in lines.items():
        (out / file).write_text("\n".join(rows) + "\n")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--types", type=int, default=1000)
    parser.add_argument("--source", type=Path, action="append",
                        help="an AWM catalog folder to clone (repeat; default: the bundled one)")
    parser.add_argument("--broken", type=int, default=0, help="types whose code fails to load")
    args = parser.parse_args()
    names = make_catalog(args.out, args.types, args.source, args.broken)
    print(f"{len(names)} env types in {args.out} ({args.broken} broken)")


if __name__ == "__main__":
    main()
