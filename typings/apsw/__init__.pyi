# apsw, as the type checker sees it here: everything is Any. apsw's own stubs type every
# column value as a union of all SQLite types, while the rows' real types are the STRICT
# tables' columns (schema/), which no type checker can see; checking against the union
# would mean a cast per column read. See pyproject.toml [tool.mypy].
from typing import Any

def __getattr__(name: str) -> Any: ...
