"""A read-only pg_catalog and information_schema describing resgroups' own relations.

The rows are built per statement from the engine's catalog snapshot, its
table store and the table functions, and answered by the relational engine
of :mod:`resgroups.sql.relational` (joins, subqueries), so psql's ``\\d``
family and drivers' ``inspect()`` queries run as they are written.

What is described: schema ``public`` holds the executor's tables (relkind
``r``) and one view (relkind ``v``) per table function over engine state
(``resource_groups`` ...); ``pg_catalog`` and ``information_schema`` hold the
catalog relations themselves. Oids are stable: PostgreSQL's own for its types,
namespaces and catalogs, a fixed one per table function, and for a table a
hash of its name. Roles are the admin (oid 10) and the principals (16384 + id);
a non-admin sees the admin and itself. Catalog relations with nothing to
describe (indexes, constraints, defaults, inheritance, descriptions) exist and
are empty.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from resgroups.catalog.names import Ident, PrincipalKind
from resgroups.errors import UndefinedTable, UndefinedType, did_you_mean
from resgroups.exec.vector import dtype_type
from resgroups.sql import ast
from resgroups.sql.select import Relation
from resgroups.sql.semantics import PgArray
from resgroups.statements.table_functions import TABLE_FUNCTIONS

if TYPE_CHECKING:
    from resgroups.session import Session

PG_CATALOG: Final = 11
PUBLIC: Final = 2200
INFORMATION_SCHEMA: Final = 13_000
ADMIN_ROLE: Final = 10
NAMESPACES: Final = {
    PG_CATALOG: "pg_catalog",
    PUBLIC: "public",
    INFORMATION_SCHEMA: "information_schema",
}

# (oid, typname, PostgreSQL's display name, typlen, typcategory)
TYPES: Final = (
    (16, "bool", "boolean", 1, "B"), (18, "char", '"char"', 1, "S"),
    (19, "name", "name", 64, "S"), (20, "int8", "bigint", 8, "N"),
    (21, "int2", "smallint", 2, "N"), (23, "int4", "integer", 4, "N"),
    (25, "text", "text", -1, "S"), (26, "oid", "oid", 4, "N"), (700, "float4", "real", 4, "N"),
    (701, "float8", "double precision", 8, "N"),
    (1043, "varchar", "character varying", -1, "S"),
    (1184, "timestamptz", "timestamp with time zone", 8, "D"),
    (1700, "numeric", "numeric", -1, "N"),
    (2249, "record", "record", -1, "P"), (2278, "void", "void", 4, "P"),
    (2279, "trigger", "trigger", 4, "P"),
)  # fmt: skip
# the executor's types (semantics) -> pg_type oid
TYPE_OIDS: Final = {
    "int": 20,
    "float": 701,
    "text": 25,
    "bool": 16,
    "timestamptz": 1184,
    "numeric": 1700,
}
DISPLAY: Final = {oid: shown for oid, _, shown, _, _ in TYPES}


@dataclass(frozen=True)
class Rel:
    """A relation a catalog row describes: its oid, schema, name, kind and columns."""

    oid: int
    namespace: int
    name: str
    kind: str  # "r" table, "v" view
    columns: tuple[tuple[str, str], ...]  # (name, executor type)


def _cols(spec: str) -> tuple[tuple[str, str], ...]:
    """``"oid:int relname"``: columns with types (text when none is written)."""
    return tuple((c.split(":")[0], [*c.split(":"), "text"][1]) for c in spec.split())


CATALOG_COLUMNS: Final[dict[tuple[int, str], tuple[int, tuple[tuple[str, str], ...]]]] = {
    (PG_CATALOG, "pg_namespace"): (2615, _cols("oid:int nspname nspowner:int nspacl")),
    (PG_CATALOG, "pg_class"): (1259, _cols(
        "oid:int relname relnamespace:int reltype:int reloftype:int relowner:int relam:int "
        "relfilenode:int reltablespace:int relpages:int reltuples:float relallvisible:int "
        "reltoastrelid:int relhasindex:bool relisshared:bool relpersistence relkind relnatts:int "
        "relchecks:int relhasrules:bool relhastriggers:bool relhassubclass:bool "
        "relrowsecurity:bool relforcerowsecurity:bool relispopulated:bool relreplident "
        "relispartition:bool relrewrite:int relacl reloptions relpartbound")),
    (PG_CATALOG, "pg_attribute"): (1249, _cols(
        "attrelid:int attname atttypid:int attstattarget:int attlen:int attnum:int attndims:int "
        "atttypmod:int attbyval:bool attalign attstorage attcompression attnotnull:bool "
        "atthasdef:bool atthasmissing:bool attidentity attgenerated attisdropped:bool "
        "attislocal:bool attinhcount:int attcollation:int attacl attoptions attfdwoptions")),
    (PG_CATALOG, "pg_type"): (1247, _cols(
        "oid:int typname typnamespace:int typowner:int typlen:int typbyval:bool typtype "
        "typcategory typispreferred:bool typisdefined:bool typdelim typrelid:int typelem:int "
        "typarray:int typbasetype:int typtypmod:int typnotnull:bool typndims:int "
        "typcollation:int typdefault")),
    (PG_CATALOG, "pg_proc"): (1255, _cols(
        "oid:int proname pronamespace:int proowner:int prolang:int prokind proretset:bool "
        "prorettype:int pronargs:int proargtypes:array proallargtypes:array proargmodes:array "
        "proargnames:array proargdefaults prosrc")),
    (PG_CATALOG, "pg_depend"): (2608, _cols(
        "classid:int objid:int objsubid:int refclassid:int refobjid:int refobjsubid:int "
        "deptype")),
    (PG_CATALOG, "pg_database"): (1262, _cols(
        "oid:int datname datdba:int encoding:int datcollate datctype datistemplate:bool "
        "datallowconn:bool datconnlimit:int datacl datlocprovider daticulocale")),
    (PG_CATALOG, "pg_roles"): (12_001, _cols(
        "oid:int rolname rolsuper:bool rolinherit:bool rolcreaterole:bool rolcreatedb:bool "
        "rolcanlogin:bool rolreplication:bool rolconnlimit:int rolpassword "
        "rolvaliduntil:timestamptz rolbypassrls:bool rolconfig")),
    (PG_CATALOG, "pg_user"): (12_002, _cols(
        "usename usesysid:int usecreatedb:bool usesuper:bool userepl:bool usebypassrls:bool "
        "passwd valuntil:timestamptz useconfig")),
    (PG_CATALOG, "pg_auth_members"): (1261, _cols(
        "roleid:int member:int grantor:int admin_option:bool")),
    (PG_CATALOG, "pg_settings"): (12_003, _cols(
        "name setting unit category short_desc context vartype source boot_val reset_val")),
    (PG_CATALOG, "pg_am"): (2601, _cols("oid:int amname amhandler amtype")),
    (PG_CATALOG, "pg_attrdef"): (2604, _cols("oid:int adrelid:int adnum:int adbin")),
    (PG_CATALOG, "pg_collation"): (3456, _cols("oid:int collname collnamespace:int collprovider")),
    (PG_CATALOG, "pg_description"): (2609, _cols(
        "objoid:int classoid:int objsubid:int description")),
    (PG_CATALOG, "pg_index"): (2610, _cols(
        "indexrelid:int indrelid:int indnatts:int indisunique:bool indisprimary:bool "
        "indisclustered:bool indisvalid:bool indisreplident:bool indkey:array")),
    (PG_CATALOG, "pg_constraint"): (2606, _cols(
        "oid:int conname connamespace:int contype condeferrable:bool condeferred:bool "
        "conrelid:int conindid:int confrelid:int contypid:int conkey:array confkey:array")),
    (PG_CATALOG, "pg_sequence"): (2224, _cols(
        "seqrelid:int seqtypid:int seqstart:int seqincrement:int seqmax:int seqmin:int "
        "seqcache:int seqcycle:bool")),
    (PG_CATALOG, "pg_enum"): (3501, _cols("oid:int enumtypid:int enumsortorder:float enumlabel")),
    (PG_CATALOG, "pg_inherits"): (2611, _cols(
        "inhrelid:int inhparent:int inhseqno:int inhdetachpending:bool")),
    (PG_CATALOG, "pg_policy"): (3256, _cols(
        "oid:int polname polrelid:int polcmd polpermissive:bool polroles:array polqual "
        "polwithcheck")),
    (PG_CATALOG, "pg_statistic_ext"): (3381, _cols(
        "oid:int stxrelid:int stxname stxnamespace:int stxowner:int stxstattarget:int "
        "stxkeys:array stxkind:array")),
    (PG_CATALOG, "pg_publication"): (6104, _cols(
        "oid:int pubname pubowner:int puballtables:bool pubinsert:bool pubupdate:bool "
        "pubdelete:bool pubtruncate:bool pubviaroot:bool")),
    (PG_CATALOG, "pg_publication_namespace"): (6237, _cols(
        "oid:int pnpubid:int pnnspid:int")),
    (PG_CATALOG, "pg_publication_rel"): (6106, _cols(
        "oid:int prpubid:int prrelid:int prqual prattrs:array")),
    (INFORMATION_SCHEMA, "tables"): (13_001, _cols(
        "table_catalog table_schema table_name table_type is_insertable_into")),
    (INFORMATION_SCHEMA, "columns"): (13_002, _cols(
        "table_catalog table_schema table_name column_name ordinal_position:int column_default "
        "is_nullable data_type character_maximum_length:int numeric_precision:int udt_name")),
}  # fmt: skip

FUNCTION_OID_BASE: Final = 16_000  # + the table function's position
LONG_SEQUENCE: Final = FUNCTION_OID_BASE + 99


def table_oid(name: str) -> int:
    """A table's oid: stable for its name (PostgreSQL's user oids start at 16384)."""
    return 100_000 + zlib.crc32(name.encode()) % 1_000_000_000


class CatalogRows:
    """Everything the catalog describes, read once per statement."""

    def __init__(self, session: Session) -> None:
        self.session = session
        engine = session.engine
        rels = [
            Rel(oid, ns, name, "r", cols) for (ns, name), (oid, cols) in CATALOG_COLUMNS.items()
        ]
        for i, fn in enumerate(TABLE_FUNCTIONS.values()):
            rels.append(Rel(FUNCTION_OID_BASE + i, PUBLIC, fn.name, "v", fn.columns))
        for name, table in engine.tables.items():
            types = tuple(dtype_type(a.dtype) for a in table.arrays)
            rels.append(
                Rel(table_oid(name), PUBLIC, name, "r", tuple(zip(table.names, types, strict=True)))
            )
        self.relations = rels
        self.by_oid = {r.oid: r for r in rels}
        who = session.identity
        snap = engine.snapshot
        roles: list[tuple[int, str, bool, bool]] = [(ADMIN_ROLE, "admin", True, True)]
        for kind in (PrincipalKind.USER, PrincipalKind.GROUP, PrincipalKind.SERVICE_ACCOUNT):
            for p in snap.principals_of(kind):
                if who.is_admin or p.name == who.login_name:
                    roles.append((16_384 + p.id, p.name, False, kind is not PrincipalKind.GROUP))
        if (
            not who.is_admin
            and who.login_name != "admin"
            and all(r[1] != who.login_name for r in roles)
        ):
            roles.append((16_383, who.login_name, False, True))
        self.roles = roles
        self.members: list[tuple[Any, ...]] = [
            (16_384 + acl, 16_384 + user, ADMIN_ROLE, False)
            for user, acl in snap.memberships
            if who.is_admin
        ]

    # ---- the relations
    def relation(self, ref: ast.TableName) -> Relation | None:
        schema = None if ref.schema is None else _fold(ref.schema)
        name = _fold(ref.name)
        search = (
            [PUBLIC, PG_CATALOG]
            if schema is None
            else [ns for ns, n in NAMESPACES.items() if n == schema]
        )
        for ns in search:
            key = (ns, name)
            if key in CATALOG_COLUMNS:
                _, cols = CATALOG_COLUMNS[key]
                produce = _ROWS.get(name)
                rows = [] if produce is None else produce(self)
                return Relation(tuple(c for c, _ in cols), rows, tuple(t for _, t in cols))
        return None

    def names(self) -> list[str]:
        return [r.name for r in self.relations]

    def regclass(self, text: str) -> int:
        """``'pg_catalog.pg_class'::regclass``: the relation's oid, found as FROM would."""
        parts = [
            Ident(p[1:-1], quoted=True) if p.startswith('"') else Ident(p) for p in text.split(".")
        ]
        ref = ast.TableName(parts[-1], parts[0] if len(parts) > 1 else None)
        schema = None if ref.schema is None else _fold(ref.schema)
        for r in self.relations:
            if r.name == _fold(ref.name) and (schema is None or NAMESPACES[r.namespace] == schema):
                return r.oid
        raise unknown_relation(ref, self.names())

    def view_definition(self, oid: Any) -> str | None:
        """A table function's view is the function's rows, all its columns."""
        r = self.by_oid.get(oid)
        return None if r is None or r.kind != "v" else f" SELECT * FROM {r.name}();"

    def regtype(self, text: str) -> int:
        name = text.lower().removeprefix("pg_catalog.")
        for oid, typname, shown, _, _ in TYPES:
            if name in (typname, shown):
                return oid
        raise UndefinedType(f'type "{text}" does not exist')

    def to_regtype(self, text: str | None) -> int | None:
        """The type's oid, or NULL when there is none (what psycopg's TypeInfo asks)."""
        try:
            return None if text is None else self.regtype(text)
        except UndefinedType:
            return None

    # ---- the functions (sql.expr.Catalog)
    def call(self, name: str, args: Sequence[Any]) -> Any:
        return _FUNCTIONS[name](self, *args)


def _fold(ident: Ident) -> str:
    return ident.text if ident.quoted else ident.text.casefold()


def _namespaces(c: CatalogRows) -> list[tuple[Any, ...]]:
    return [(oid, name, ADMIN_ROLE, None) for oid, name in NAMESPACES.items()]


def _classes(c: CatalogRows) -> list[tuple[Any, ...]]:
    return [
        (r.oid, r.name, r.namespace, 0, 0, ADMIN_ROLE, 2 if r.kind == "r" else 0, r.oid, 0, 0,
         -1.0, 0, 0, False, False, "p", r.kind, len(r.columns), 0, False, False, False, False,
         False, True, "d", False, 0, None, None, None)
        for r in c.relations
    ]  # fmt: skip


def _attributes(c: CatalogRows) -> list[tuple[Any, ...]]:
    rows = []
    for r in c.relations:
        for n, (name, kind) in enumerate(r.columns, 1):
            oid = TYPE_OIDS.get(kind, 25)
            length = next(t[3] for t in TYPES if t[0] == oid)
            coll = 100 if oid == 25 else 0
            rows.append((r.oid, name, oid, -1, length, n, 0, -1, length > 0, "d", "p", "", False,
                         False, False, "", "", False, True, 0, coll, None, None, None))  # fmt: skip
    return rows


def _types(c: CatalogRows) -> list[tuple[Any, ...]]:
    return [
        (oid, name, PG_CATALOG, ADMIN_ROLE, length, 0 < length <= 8, "b", category, False, True,
         ",", 0, 0, 0, 0, -1, False, 0, 100 if category == "S" else 0, None)
        for oid, name, _, length, category in TYPES
    ]  # fmt: skip


def _procs(c: CatalogRows) -> list[tuple[Any, ...]]:
    # prorettype 2249 is PostgreSQL's record: each returns a table (RETURNS TABLE)
    rows: list[tuple[Any, ...]] = [
        (FUNCTION_OID_BASE + i, fn.name, PUBLIC, ADMIN_ROLE, 12, "f", True, 2249, 0,
         PgArray(), None, None, None, None, fn.name)
        for i, fn in enumerate(TABLE_FUNCTIONS.values())
    ]  # fmt: skip
    rows.append((LONG_SEQUENCE, "long_sequence", PUBLIC, ADMIN_ROLE, 12, "f", True, 2249, 1,
                 PgArray([20]), None, None, PgArray(["n"]), None, "long_sequence"))  # fmt: skip
    return rows


def _roles(c: CatalogRows) -> list[tuple[Any, ...]]:
    return [(oid, name, sup, True, sup, sup, login, False, -1, "********", None, sup, None)
            for oid, name, sup, login in c.roles]  # fmt: skip


def _users(c: CatalogRows) -> list[tuple[Any, ...]]:
    return [(name, oid, sup, sup, False, sup, "********", None, None)
            for oid, name, sup, login in c.roles if login]  # fmt: skip


def _settings(c: CatalogRows) -> list[tuple[Any, ...]]:
    values = {"server_version": "15.0", "server_encoding": "UTF8", "client_encoding": "UTF8",
              "search_path": '"$user", public', "standard_conforming_strings": "on",
              "TimeZone": "UTC", "DateStyle": "ISO, MDY", "integer_datetimes": "on"}  # fmt: skip
    return [
        (k, v, None, "resgroups", k, "user", "string", "default", v, v) for k, v in values.items()
    ]


def _database(c: CatalogRows) -> list[tuple[Any, ...]]:
    return [(1, c.session.database, ADMIN_ROLE, 6, "C", "C", False, True, -1, None, "c", None)]


def _tables(c: CatalogRows) -> list[tuple[Any, ...]]:
    return [
        (c.session.database, NAMESPACES[r.namespace], r.name,
         "BASE TABLE" if r.kind == "r" else "VIEW", "NO")
        for r in c.relations
    ]  # fmt: skip


def _columns(c: CatalogRows) -> list[tuple[Any, ...]]:
    rows = []
    for r in c.relations:
        for n, (name, kind) in enumerate(r.columns, 1):
            oid = TYPE_OIDS.get(kind, 25)
            typname = next(t[1] for t in TYPES if t[0] == oid)
            precision = {20: 64, 701: 53}.get(oid)
            rows.append((c.session.database, NAMESPACES[r.namespace], r.name, name, n, None,
                         "YES", DISPLAY[oid], None, precision, typname))  # fmt: skip
    return rows


_ROWS: Final[dict[str, Callable[[CatalogRows], list[tuple[Any, ...]]]]] = {
    "pg_namespace": _namespaces,
    "pg_class": _classes,
    "pg_attribute": _attributes,
    "pg_type": _types,
    "pg_proc": _procs,
    "pg_database": _database,
    "pg_roles": _roles,
    "pg_user": _users,
    "pg_auth_members": lambda c: list(c.members),
    "pg_settings": _settings,
    "pg_am": lambda c: [(2, "heap", "heap_tableam_handler", "t")],
    "pg_collation": lambda c: [(100, "default", PG_CATALOG, "d"), (950, "C", PG_CATALOG, "c")],
    "tables": _tables,
    "columns": _columns,
}


def _role_name(c: CatalogRows, oid: Any) -> Any:
    if oid is None:
        return None
    return next((name for o, name, _, _ in c.roles if o == oid), f"unknown (OID={oid})")


def _format_type(c: CatalogRows, oid: Any, typmod: Any) -> Any:
    return None if oid is None else DISPLAY.get(oid, "???")


def _function_result(c: CatalogRows, oid: Any) -> Any:
    fns = list(TABLE_FUNCTIONS.values())
    i = (oid or 0) - FUNCTION_OID_BASE
    if 0 <= i < len(fns):
        cols = ", ".join(f"{n} {DISPLAY[TYPE_OIDS.get(t, 25)]}" for n, t in fns[i].columns)
        return f"TABLE({cols})"
    return "TABLE(x bigint)" if oid == LONG_SEQUENCE else None


def _function_arguments(c: CatalogRows, oid: Any) -> Any:
    return "n bigint" if oid == LONG_SEQUENCE else ""


_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "pg_table_is_visible": lambda c, oid: (
        oid in c.by_oid and c.by_oid[oid].namespace != INFORMATION_SCHEMA
    ),
    "pg_function_is_visible": lambda c, oid: True,
    "pg_type_is_visible": lambda c, oid: True,
    "pg_get_userbyid": _role_name,
    "format_type": _format_type,
    "pg_get_function_result": _function_result,
    "pg_get_function_arguments": _function_arguments,
    "pg_get_function_identity_arguments": _function_arguments,
    "obj_description": lambda c, *a: None,
    "col_description": lambda c, *a: None,
    "shobj_description": lambda c, *a: None,
    "pg_get_expr": lambda c, *a: None,  # no defaults, checks or partition bounds here
    "pg_encoding_to_char": lambda c, n: "UTF8" if n == 6 else "",
    "pg_get_constraintdef": lambda c, *a: None,  # there are no constraints
    "pg_get_serial_sequence": lambda c, *a: None,  # nor sequences
    "pg_collation_is_visible": lambda c, oid: True,
    "pg_relation_is_publishable": lambda c, oid: False,  # there are no publications
    "pg_get_statisticsobjdef_columns": lambda c, oid: None,
    "pg_get_indexdef": lambda c, *a: None,
    "regclass": lambda c, name: c.regclass(name),
    "regtype": lambda c, name: c.regtype(name),
    "to_regtype": lambda c, name: c.to_regtype(name),
    "regtype_name": lambda c, oid: None if oid is None else next(
        (t[2] for t in TYPES if t[0] == oid), str(oid)
    ),
    "regclass_name": lambda c, oid: None if oid is None else (
        c.by_oid[oid].name if oid in c.by_oid else str(oid)
    ),
    "regnamespace_name": lambda c, oid: None if oid is None else NAMESPACES.get(oid, str(oid)),
    "pg_get_viewdef": lambda c, oid, *pretty: c.view_definition(oid),
    "current_schemas": lambda c, implicit: PgArray(
        ["pg_catalog", "public"] if implicit else ["public"]
    ),
    "array_to_string": lambda c, arr, sep, *null: None if arr is None else sep.join(
        str(v) if v is not None else (null[0] if null else "") for v in arr if v is not None or null
    ),
}  # fmt: skip


def catalog_columns(ref: ast.TableName) -> tuple[tuple[str, str], ...] | None:
    """The columns (name, type) of the catalog relation ``ref`` names, found as
    FROM finds it; None when it names none."""
    schema = None if ref.schema is None else _fold(ref.schema)
    search = (
        [PUBLIC, PG_CATALOG]
        if schema is None
        else [ns for ns, n in NAMESPACES.items() if n == schema]
    )
    for ns in search:
        found = CATALOG_COLUMNS.get((ns, _fold(ref.name)))
        if found is not None:
            return found[1]
    return None


def is_catalog_relation(name: str) -> bool:
    return any(n == name for _, n in CATALOG_COLUMNS)


def unknown_relation(ref: ast.TableName, known: list[str]) -> UndefinedTable:
    shown = ref.name.text if ref.schema is None else f"{ref.schema.text}.{ref.name.text}"
    candidates = known + [n for _, n in CATALOG_COLUMNS]
    return UndefinedTable(
        f'relation "{shown}" does not exist.' + did_you_mean(ref.name.text, candidates)
    )
