"""opod's model catalog: one YAML file per model, validated against the entry schema.

Entries come from three layers, a later one replacing an earlier entry of the
same id: the files bundled in ``opod/catalog/models``, then ``OPOD_CATALOG_DIR``,
then ``~/.opod/catalog``.
"""

from opod.catalog.loader import Catalog, CatalogError, bundled_dir, load_catalog, load_entry

__all__ = ["Catalog", "CatalogError", "bundled_dir", "load_catalog", "load_entry"]
