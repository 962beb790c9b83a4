"""Load environment catalogs from folders of AWM JSONL files."""

from envfarm.catalog._loader import BUNDLED_CATALOG, Catalog, load_catalog, normalize_name

__all__ = ["BUNDLED_CATALOG", "Catalog", "load_catalog", "normalize_name"]
