"""Load environment catalogs from folders of AWM JSONL files."""

from envfarm.catalog._loader import (
    AWM_FILES,
    BUNDLED_CATALOG,
    Catalog,
    catalog_fingerprint,
    load_catalog,
    normalize_name,
    verifier_sha256,
)

__all__ = ["AWM_FILES", "BUNDLED_CATALOG", "Catalog", "catalog_fingerprint", "load_catalog",
           "normalize_name", "verifier_sha256"]
