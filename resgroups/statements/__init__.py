"""Statement dispatch: what each parsed statement does to the catalog, the
session and the executor (above ``resgroups.sql`` and ``resgroups.exec``)."""
