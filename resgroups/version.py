"""Which resgroups this is, and the PostgreSQL version its wire protocol speaks as."""

from __future__ import annotations

from typing import Final

__version__: Final = "0.1.0"

# what ``server_version`` reports to PostgreSQL clients: drivers read the major
# number to decide which features the server has (libpq parses "15.0 ...")
SERVER_VERSION: Final = "15.0"
SERVER_VERSION_NUM: Final = "150000"  # SHOW server_version_num

# what ``SELECT version()`` returns: PostgreSQL's shape, so tools that read the
# version out of it find one, naming resgroups as the server
VERSION_STRING: Final = f"PostgreSQL {SERVER_VERSION} (resgroups {__version__})"
