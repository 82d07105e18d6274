"""Text to statements: Lark's LALR parser with an embedded Transformer.

The grammar lives in ``grammar.lark`` beside this file. The transformer runs
during the parse (no tree is built) and returns the frozen dataclasses of
:mod:`resgroups.sql.ast`; parameter values are checked and typed as they are
reduced, so a bad value fails the parse with :class:`InvalidParameter`.

``parse_script`` costs about 50-100 µs for a typical DDL statement
(``perf/bench_parse.py``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from typing import Any, Final

from lark import Lark, Token, Transformer, v_args
from lark import __version__ as lark_version
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import BasicLexer, PatternStr

from resgroups.catalog.params import INT32_MAX, RawValue, lookup, parse_param, parse_size
from resgroups.catalog.rules import KILL, LOG, MOVE, parse_watch
from resgroups.catalog.rules import metric as rule_metric
from resgroups.catalog.selectors import ATTRIBUTES as SELECTOR_ATTRIBUTES
from resgroups.catalog.selectors import KINDS as SELECTOR_KINDS
from resgroups.catalog.selectors import condition_problem as selector_condition_problem
from resgroups.errors import (
    InvalidParameter,
    NumericOverflow,
    ProgramLimitExceeded,
    SqlSyntaxError,
    UndefinedFunction,
    UndefinedType,
    did_you_mean,
)
from resgroups.sql import ast
from resgroups.sql.params import UndefinedParameter, placeholder_number
from resgroups.sql.semantics import ARRAY, cast_target

MAX_SELECT_ITEMS: Final = 1664  # as PostgreSQL (and a RowDescription's int16 count)

__all__ = [
    "MAX_DEPTH",
    "MAX_LITERAL_CHARS",
    "MAX_SCRIPT_CHARS",
    "interruptible",
    "keywords",
    "parse_one",
    "parse_script",
    "placeholders_allowed",
]

# The front end's limits (docs/sql.md): every statement is answered in bounded
# time and memory, and everything after the parse (typing, evaluation,
# formatting) may recurse over a tree no deeper than MAX_DEPTH.
MAX_SCRIPT_CHARS: Final = 1_000_000  # the text given to one execute()
MAX_LITERAL_CHARS: Final = 100  # a numeric literal, as written
MAX_DEPTH: Final = 200  # nesting of expressions (parentheses, operators, calls)
INTERRUPT_EVERY: Final = 1024  # tokens lexed between two interrupt checks


class _Interrupt(threading.local):
    check: Callable[[], None] | None = None
    tokens: int = 0


_interrupt: Final = _Interrupt()


@contextmanager
def interruptible(check: Callable[[], None]) -> Iterator[None]:
    """Parses on this thread call ``check`` every INTERRUPT_EVERY tokens; what it
    raises (a cancel, the client gone) ends the parse. A long statement is
    then as interruptible as a query (the wire protocol's cancel and
    disconnect)."""
    before = _interrupt.check
    _interrupt.check, _interrupt.tokens = check, 0
    try:
        yield
    finally:
        _interrupt.check = before


def _tick(tok: Token) -> Token:
    check = _interrupt.check
    if check is not None:
        _interrupt.tokens += 1
        if _interrupt.tokens % INTERRUPT_EVERY == 0:
            check()
    return tok


def _check_literal(tok: Token) -> None:
    if len(tok) > MAX_LITERAL_CHARS:
        raise _PositionedLimit(
            f"numeric literal of {len(tok)} characters exceeds the limit of {MAX_LITERAL_CHARS}",
            tok,
        )


class _PositionedError(Exception):
    """Raised inside the transformer; ``parse_script`` adds line, column and caret."""

    def __init__(self, message: str, token: Token) -> None:
        super().__init__(message)
        self.message = message
        self.token = token


class _PositionedLimit(_PositionedError):
    """A limit of MAX_* exceeded: ProgramLimitExceeded, with its position."""


class _PositionedParameter(_PositionedError):
    """``$n`` where no value is bound: UndefinedParameter (42P02), with its position."""


class _Placeholders(threading.local):
    allowed: bool = False
    # the types of placeholders where the grammar takes only a literal (LIMIT $1,
    # an integer option's value), known from the position alone
    literal_types: dict[int, str] | None = None


_placeholders: Final = _Placeholders()

# resource group options whose value is an integer (the others take text too:
# sizes, durations, percentages, names)
_INTEGER_OPTIONS: Final = frozenset({"cpu_weight", "max_active_queries", "max_queued_queries"})


@contextmanager
def placeholders_allowed() -> Iterator[dict[int, str]]:
    """Parses on this thread keep ``$n`` as :class:`~resgroups.sql.ast.Param`
    (to infer the types of a prepared statement's parameters) instead of
    refusing it: a statement runs only with its values bound. Yields the types
    of the placeholders found where only a literal stands (``LIMIT $1``: int),
    filled as the block parses; such a placeholder parses as a stand-in value."""
    before = _placeholders.allowed, _placeholders.literal_types
    found: dict[int, str] = {}
    _placeholders.allowed, _placeholders.literal_types = True, found
    try:
        yield found
    finally:
        _placeholders.allowed, _placeholders.literal_types = before


def _literal_placeholder(tok: Token, type_name: str | None) -> None:
    """``$n`` where the grammar takes a literal: recorded with its type, or 42P02."""
    if not _placeholders.allowed:
        raise _PositionedParameter(f"there is no parameter {tok}", tok)
    found = _placeholders.literal_types
    if found is not None and type_name is not None:
        found.setdefault(placeholder_number(tok[1:]), type_name)


def _unquote(text: str, quote: str) -> str:
    return text[1:-1].replace(quote * 2, quote)


def _binary(op: str) -> Any:
    return lambda self, left, right: ast.Binary(op, left, right)


@v_args(inline=True)
class _ToAst(Transformer[Token, Any]):
    # ---- names
    def ident(self, tok: Token) -> ast.Ident:
        return ast.Ident(str(tok))

    def quoted_ident(self, tok: Token) -> ast.Ident:
        text = _unquote(tok, '"')
        if not text:
            raise _PositionedError("empty quoted identifier", tok)
        return ast.Ident(text, quoted=True)

    def default_group(self) -> ast.Ident:
        return ast.DEFAULT_GROUP

    def group_name(self, name: ast.Ident) -> ast.Ident:
        return name

    def variant_group(self, base: ast.Ident, variant: ast.Ident) -> ast.Ident:
        """``tenants::acme``: quoted (matched exactly) when either part is."""
        return ast.Ident(f"{base.text}::{variant.text}", base.quoted or variant.quoted)

    # ---- parameter values
    def number_value(self, tok: Token) -> RawValue:
        _check_literal(tok)
        return RawValue("number", str(tok))

    def quantity_value(self, number: Token, unit: Token) -> RawValue:
        """A size or a duration written bare, as QuestDB users type them (2G, 15s)."""
        _check_literal(number)
        return RawValue("quantity", f"{number}{unit}")

    def negative_value(self, tok: Token) -> RawValue:
        _check_literal(tok)
        return RawValue("number", "-" + tok)

    def string_value(self, tok: Token) -> RawValue:
        return RawValue("string", _unquote(tok, "'"))

    def unlimited_value(self) -> RawValue:
        return RawValue("word", "UNLIMITED")

    def word_value(self, tok: Token) -> RawValue:
        return RawValue("word", str(tok))

    def quoted_word_value(self, tok: Token) -> RawValue:
        text = _unquote(tok, '"')
        if not text:
            raise _PositionedError("empty quoted identifier", tok)
        return RawValue("quoted", text)

    def parameter_value(self, tok: Token) -> RawValue:
        _literal_placeholder(tok, None)  # typed by the option it sets (param below)
        return RawValue("parameter", str(tok))

    def param(self, name: Token, raw: RawValue) -> tuple[str, ast.ParamValue]:
        if raw.kind == "parameter":  # only while placeholders are allowed
            option = lookup(str(name))
            found = _placeholders.literal_types
            if found is not None:
                kind = "int" if option.name in _INTEGER_OPTIONS else "text"
                found.setdefault(placeholder_number(raw.text[1:]), kind)
            return option.name, option.default
        return parse_param(str(name), raw)

    def with_params(self, *params: tuple[str, ast.ParamValue]) -> tuple[Any, ...]:
        return _no_repeats(params)

    # ---- resource groups
    def if_not_exists(self) -> bool:
        return True

    def if_exists(self) -> bool:
        return True

    def create_resource_group(
        self,
        if_not_exists: bool | None,
        name: ast.Ident,
        params: tuple[Any, ...] | None,
        variants: tuple[ast.Variant, ...] | None,
    ) -> ast.CreateResourceGroup:
        return ast.CreateResourceGroup(name, params or (), bool(if_not_exists), variants or ())

    def variants(self, *variants: ast.Variant) -> tuple[ast.Variant, ...]:
        return variants

    def variant(self, name: ast.Ident, params: tuple[Any, ...] | None) -> ast.Variant:
        return ast.Variant(name, params or ())

    def add_variant(
        self, group: ast.Ident, name: ast.Ident, params: tuple[Any, ...] | None
    ) -> ast.AddVariant:
        return ast.AddVariant(group, ast.Variant(name, params or ()))

    def drop_variant(
        self, group: ast.Ident, if_exists: bool | None, name: ast.Ident
    ) -> ast.DropVariant:
        return ast.DropVariant(group, name, bool(if_exists))

    def alter_resource_group_set(
        self, name: ast.Ident, *params: tuple[str, ast.ParamValue]
    ) -> ast.AlterResourceGroupSet:
        return ast.AlterResourceGroupSet(name, _no_repeats(params))

    def alter_resource_group_reset(
        self, name: ast.Ident, *names: Token
    ) -> ast.AlterResourceGroupReset:
        seen = tuple(dict.fromkeys(lookup(str(n)).name for n in names))
        return ast.AlterResourceGroupReset(name, seen)

    def rename_resource_group(
        self, name: ast.Ident, new_name: ast.Ident
    ) -> ast.RenameResourceGroup:
        return ast.RenameResourceGroup(name, new_name)

    def drop_resource_group(self, if_exists: bool | None, name: ast.Ident) -> ast.DropResourceGroup:
        return ast.DropResourceGroup(name, bool(if_exists))

    # ---- runaway-query rules
    def rule_metric(self, name: Token) -> str:
        return rule_metric(str(name)).name

    def memory_metric(self) -> str:
        return "memory"

    def rule_condition(self, name: str, raw: RawValue) -> tuple[str, int]:
        return name, rule_metric(name).parse(raw)

    def rule_action_word(self, word: Token) -> tuple[str, ast.Ident | None]:
        action = str(word).lower()
        if action not in (KILL, LOG):
            hint = " (MOVE names its target: MOVE TO RESOURCE GROUP g)" if action == MOVE else ""
            raise _PositionedError(
                f"unknown rule action {str(word)!r}: expected KILL, MOVE TO RESOURCE GROUP "
                f"name or LOG{hint}",
                word,
            )
        return action, None

    def rule_action_move(self, word: Token, group: ast.Ident) -> tuple[str, ast.Ident | None]:
        if str(word).lower() != MOVE:
            raise _PositionedError(
                f"unknown rule action {str(word)!r}: expected MOVE TO RESOURCE GROUP name",
                word,
            )
        return MOVE, group

    def rule_option(self, name: Token, raw: RawValue) -> tuple[str, int]:
        if str(name).lower() != "watch":
            raise InvalidParameter(
                f"unknown resource rule option {str(name)!r}; allowed: watch."
                + did_you_mean(str(name), ("watch",))
            )
        return "watch", parse_watch(raw)

    def rule_options(self, *options: tuple[str, int]) -> int:
        watch: int = dict(_no_repeats(options))["watch"]
        return watch

    def create_resource_rule(
        self,
        word: Token,
        if_not_exists: bool | None,
        name: ast.Ident,
        group: ast.Ident,
        *rest: Any,
    ) -> ast.CreateResourceRule:
        _resource_object(word, ("rule",))
        watch = rest[-1]  # rule_options, or None
        action, target = rest[-2]
        if watch and action == LOG:
            raise InvalidParameter(
                f"rule {name.text}: watch applies to KILL and MOVE, not to LOG "
                "(a LOG does nothing to the query to repeat)"
            )
        conditions = rest[:-2]
        metrics = [m for m, _ in conditions]
        repeated = sorted({m for m in metrics if metrics.count(m) > 1})
        if repeated:
            raise InvalidParameter(
                f"rule {name.text} has two conditions on {', '.join(repeated)}; "
                "write one threshold per metric (two rules express OR)"
            )
        return ast.CreateResourceRule(
            name, group, tuple(conditions), action, target, watch or 0, bool(if_not_exists)
        )

    def rename_resource_object(
        self, word: Token, name: ast.Ident, new_name: ast.Ident
    ) -> ast.Statement:
        if _resource_object(word, RESOURCE_OBJECTS) == "selector":
            return ast.RenameResourceSelector(name, new_name)
        return ast.RenameResourceRule(name, new_name)

    def drop_resource_object(
        self, word: Token, if_exists: bool | None, name: ast.Ident
    ) -> ast.Statement:
        if _resource_object(word, RESOURCE_OBJECTS) == "selector":
            return ast.DropResourceSelector(name, bool(if_exists))
        return ast.DropResourceRule(name, bool(if_exists))

    # ---- selectors
    def selector_attribute(self, name: Token) -> str:
        attribute = str(name).lower()
        if attribute not in SELECTOR_ATTRIBUTES:
            raise InvalidParameter(
                f"unknown selector condition {str(name)!r}; a condition is one of "
                f"{', '.join(SELECTOR_ATTRIBUTES)}." + did_you_mean(str(name), SELECTOR_ATTRIBUTES)
            )
        return attribute

    def user_attribute(self) -> str:
        return "user"

    def _selector_condition(self, attribute: str, op: str, raw: RawValue) -> tuple[Any, ...]:
        ops, numeric = SELECTOR_ATTRIBUTES[attribute]
        if op not in ops:
            allowed = " or ".join(o.upper() if o == "like" else o for o in ops)
            raise InvalidParameter(
                f"selector condition {attribute} {op.upper()} {raw}: {attribute} takes {allowed}"
            )
        value: str | int
        if attribute == "estimated_memory":
            if raw.kind in ("word", "string") and raw.text.lower() == "unlimited":
                raise InvalidParameter(f"invalid value {raw} for estimated_memory: expected a size")
            value = parse_size(raw, "estimated_memory")
        elif numeric:
            text = raw.text.strip()
            if raw.kind != "number" or not text.isdigit() or len(text) > 19:
                raise InvalidParameter(
                    f"invalid value {raw} for {attribute}: expected an integer 0..2^63-1"
                )
            value = int(text)
        elif raw.kind == "string" or (attribute == "kind" and raw.kind == "word"):
            value = raw.text.lower() if attribute == "kind" else raw.text
        else:
            raise InvalidParameter(
                f"invalid value {raw} for {attribute}: expected a quoted string ('...')"
            )
        problem = selector_condition_problem((attribute, op, value))
        if problem is not None:
            raise InvalidParameter(f"invalid selector condition: {problem}")
        return attribute, op, value

    def selector_eq(self, attribute: str, raw: RawValue) -> tuple[Any, ...]:
        return self._selector_condition(attribute, "=", raw)

    def selector_eq_select(self, attribute: str) -> tuple[Any, ...]:
        return self._selector_condition(attribute, "=", RawValue("word", "select"))

    def selector_like(self, attribute: str, raw: RawValue) -> tuple[Any, ...]:
        return self._selector_condition(attribute, "like", raw)

    def selector_lt(self, attribute: str, raw: RawValue) -> tuple[Any, ...]:
        return self._selector_condition(attribute, "<", raw)

    def selector_gt(self, attribute: str, raw: RawValue) -> tuple[Any, ...]:
        return self._selector_condition(attribute, ">", raw)

    def selector_option(self, name: Token, raw: RawValue) -> tuple[str, int]:
        raise InvalidParameter(
            f"unknown resource selector option {str(name)!r}; allowed: priority."
            + did_you_mean(str(name), ("priority",))
        )

    def selector_priority(self, raw: RawValue) -> tuple[str, int]:
        text = raw.text.strip()
        if raw.kind != "number" or not text.isdigit() or len(text) > 10 or int(text) > INT32_MAX:
            raise InvalidParameter(f"invalid value {raw} for priority: expected 0..{INT32_MAX}")
        return "priority", int(text)

    def selector_options(self, *options: tuple[str, int]) -> int:
        priority: int = dict(_no_repeats(options))["priority"]
        return priority

    def create_resource_selector(
        self, word: Token, if_not_exists: bool | None, name: ast.Ident, *rest: Any
    ) -> ast.CreateResourceSelector:
        _resource_object(word, ("selector",))
        priority, group, conditions = rest[-1], rest[-2], rest[:-2]
        return ast.CreateResourceSelector(
            name, tuple(conditions), group, priority or 0, bool(if_not_exists)
        )

    # ---- principals
    def kind_user(self) -> ast.PrincipalKind:
        return ast.PrincipalKind.USER

    def kind_group(self) -> ast.PrincipalKind:
        return ast.PrincipalKind.GROUP

    def kind_service_account(self) -> ast.PrincipalKind:
        return ast.PrincipalKind.SERVICE_ACCOUNT

    def password(self, tok: Token) -> Token:
        return tok

    def create_principal(
        self, kind: ast.PrincipalKind, name: ast.Ident, password: Token | None
    ) -> ast.CreatePrincipal:
        if password is not None and kind is ast.PrincipalKind.GROUP:
            raise _PositionedError(
                "CREATE GROUP takes no password (a group cannot log in)", password
            )
        return ast.CreatePrincipal(
            kind, name, None if password is None else _unquote(password, "'")
        )

    def drop_principal(self, kind: ast.PrincipalKind, name: ast.Ident) -> ast.DropPrincipal:
        return ast.DropPrincipal(kind, name)

    def add_user(self, user: ast.Ident, *groups: ast.Ident) -> ast.AddUser:
        return ast.AddUser(user, groups)

    def remove_user(self, user: ast.Ident, *groups: ast.Ident) -> ast.RemoveUser:
        return ast.RemoveUser(user, groups)

    def grant_assume(self, account: ast.Ident, user: ast.Ident) -> ast.GrantAssume:
        return ast.GrantAssume(account, user)

    def revoke_assume(self, account: ast.Ident, user: ast.Ident) -> ast.RevokeAssume:
        return ast.RevokeAssume(account, user)

    def assume_service_account(self, account: ast.Ident) -> ast.AssumeServiceAccount:
        return ast.AssumeServiceAccount(account)

    def exit_service_account(self) -> ast.ExitServiceAccount:
        return ast.ExitServiceAccount()

    def mapping_priority(self, keyword: Token, raw: RawValue) -> tuple[Token, int]:
        allowed = f"MAPPING PRIORITY must be an integer 0..{INT32_MAX}"
        if raw.kind != "number" or not raw.text.lstrip("-").isdigit():
            raise InvalidParameter(f"invalid value {raw}: {allowed}")
        value = int(raw.text)
        if not 0 <= value <= INT32_MAX:
            raise InvalidParameter(f"invalid value {raw}: {allowed}")
        return keyword, value

    def set_mapping(
        self,
        kind: ast.PrincipalKind,
        name: ast.Ident,
        group: ast.Ident,
        priority: tuple[Token, int] | None,
    ) -> ast.SetMapping:
        if priority is None:
            return ast.SetMapping(kind, name, group)
        if kind is not ast.PrincipalKind.GROUP:
            raise _PositionedError(
                f"MAPPING PRIORITY is accepted only on ALTER GROUP, not ALTER {kind.sql}",
                priority[0],
            )
        return ast.SetMapping(kind, name, group, priority[1])

    def unset_mapping(self, kind: ast.PrincipalKind, name: ast.Ident) -> ast.SetMapping:
        return ast.SetMapping(kind, name, None)

    def set_memory_limit(
        self, kind: ast.PrincipalKind, name: ast.Ident, raw: RawValue
    ) -> ast.SetMemoryLimit:
        return ast.SetMemoryLimit(kind, name, parse_size(raw, "MEMORY LIMIT") or None)

    def grant_admin(self, principal: ast.Ident) -> ast.GrantAdmin:
        return ast.GrantAdmin(principal)

    def revoke_admin(self, principal: ast.Ident) -> ast.RevokeAdmin:
        return ast.RevokeAdmin(principal)

    def grant_use(self, group: ast.Ident, principal: ast.Ident) -> ast.GrantUse:
        return ast.GrantUse(group, principal)

    def grant_use_all(self, principal: ast.Ident) -> ast.GrantUse:
        return ast.GrantUse(None, principal)

    def revoke_use(self, group: ast.Ident, principal: ast.Ident) -> ast.RevokeUse:
        return ast.RevokeUse(group, principal)

    def revoke_use_all(self, principal: ast.Ident) -> ast.RevokeUse:
        return ast.RevokeUse(None, principal)

    # ---- session control
    def set_resource_group(self, group: ast.Ident) -> ast.SetResourceGroup:
        return ast.SetResourceGroup(group)

    def reset_resource_group(self) -> ast.ResetResourceGroup:
        return ast.ResetResourceGroup()

    def reset_all(self) -> ast.ResetAll:
        return ast.ResetAll()

    def discard_all(self) -> ast.DiscardAll:
        return ast.DiscardAll()

    def explain_resource_group(
        self, target: tuple[ast.PrincipalKind, ast.Ident] | None, *attributes: Any
    ) -> ast.ExplainResourceGroup:
        kind, name = target if target is not None else (None, None)
        given: dict[str, Any] = {}
        for word, value in attributes:
            if word in given:
                raise InvalidParameter(f"EXPLAIN RESOURCE GROUP: {word.upper()} given twice")
            given[word] = value
        return ast.ExplainResourceGroup(
            kind, name, given.get("application"), given.get("tags"), given.get("kind")
        )

    def _explain_word(self, word: Token) -> str:
        name = str(word).lower()
        if name not in ("application", "tags", "kind"):
            raise _PositionedError(
                f"unknown EXPLAIN RESOURCE GROUP attribute {str(word)!r}: expected "
                "APPLICATION 'name', TAGS ('tag', ...) or KIND kind",
                word,
            )
        return name

    def explain_value(self, word: Token, text: Token) -> tuple[str, Any]:
        name = self._explain_word(word)
        value = _unquote(text, "'")
        if name == "tags":
            return name, (value,)
        if name == "kind":
            return self._explain_kind(value)
        return name, value

    def explain_word(self, word: Token, value: Token) -> tuple[str, Any]:
        if self._explain_word(word) != "kind":
            raise _PositionedError(
                f"{str(word).upper()} takes a quoted string ('...'), not {value!s}", value
            )
        return self._explain_kind(str(value))

    @staticmethod
    def _explain_kind(kind: str) -> tuple[str, Any]:
        if kind.lower() not in SELECTOR_KINDS:
            raise InvalidParameter(f"KIND {kind}: expected one of {', '.join(SELECTOR_KINDS)}")
        return "kind", kind.lower()

    def explain_list(self, word: Token, *texts: Token) -> tuple[str, Any]:
        name = self._explain_word(word)
        if name != "tags":
            raise _PositionedError(f"{name.upper()} takes one value, not a list", word)
        return name, tuple(_unquote(t, "'") for t in texts)

    def explain_kind_select(self, word: Token) -> tuple[str, Any]:
        if self._explain_word(word) != "kind":
            raise _PositionedError(f"{str(word).upper()} SELECT: only KIND takes SELECT", word)
        return "kind", "select"

    def explain_for_user(self, name: ast.Ident) -> tuple[ast.PrincipalKind, ast.Ident]:
        return ast.PrincipalKind.USER, name

    def explain_for_account(self, name: ast.Ident) -> tuple[ast.PrincipalKind, ast.Ident]:
        return ast.PrincipalKind.SERVICE_ACCOUNT, name

    def show_users(self) -> ast.Show:
        return ast.Show(ast.PrincipalKind.USER)

    def show_groups(self) -> ast.Show:
        return ast.Show(ast.PrincipalKind.GROUP)

    def show_service_accounts(self) -> ast.Show:
        return ast.Show(ast.PrincipalKind.SERVICE_ACCOUNT)

    def show_resource_groups(self) -> ast.Select:
        """SHOW RESOURCE GROUPS is ``SELECT * FROM resource_groups()``: the same
        rows, columns and permissions."""
        return ast.Select(None, ast.TableFunction("resource_groups"))

    # ---- queries
    def select(
        self,
        items: tuple[ast.SelectItem, ...] | None,
        source: ast.Source | None,
        where: ast.Expr | None,
        group_by: tuple[ast.Expr, ...] | None,
        order_by: tuple[ast.OrderItem, ...] | None,
        limit: int | None,
        offset: int | None,
    ) -> ast.Select:
        return ast.Select(items, source, where, order_by or (), limit, offset or 0, group_by or ())

    def union(self, first: ast.Select, *rest: Any) -> ast.Union:
        selects = [first, *rest[1::2]]
        last = selects[-1]
        selects[-1] = dataclasses.replace(last, order_by=(), limit=None, offset=0)
        return ast.Union(tuple(selects), tuple(rest[0::2]), last.order_by, last.limit, last.offset)

    def union_distinct(self) -> bool:
        return False

    def union_all(self) -> bool:
        return True

    def group_clause(self, *exprs: ast.Expr) -> tuple[ast.Expr, ...]:
        return exprs

    def derived_table(self, select: ast.Select, alias: ast.Ident) -> ast.DerivedTable:
        return ast.DerivedTable(select, alias)

    def select_star(self) -> None:
        return None

    def select_list(self, *items: ast.SelectItem) -> tuple[ast.SelectItem, ...]:
        if len(items) > MAX_SELECT_ITEMS:  # PostgreSQL's own limit: 1664 (54011)
            raise ProgramLimitExceeded(
                f"target lists can have at most {MAX_SELECT_ITEMS} entries, "
                f"this one has {len(items)}",
                sqlstate="54011",
            )
        return items

    def select_item_plain(self, expr: ast.Expr) -> ast.SelectItem:
        return ast.SelectItem(expr)

    def select_item_alias(self, expr: ast.Expr, *rest: ast.Ident | None) -> ast.SelectItem:
        return ast.SelectItem(expr, rest[-1])

    def select_item_default(self, expr: ast.Expr) -> ast.SelectItem:
        return ast.SelectItem(expr, ast.Ident("default"))

    def from_clause(self, first: ast.Source, *rest: ast.Source) -> ast.Source:
        source = first
        for item in rest:  # FROM a, b, c: cross joins, left to right
            source = ast.Join(source, item, "cross")
        return source

    def join(self, left: ast.Source, kind: str, right: ast.Source, on: ast.Expr) -> ast.Join:
        return ast.Join(left, right, kind, on)

    def inner_join(self, *_: object) -> str:
        return "inner"

    def left_join(self, *_: object) -> str:
        return "left"

    def alias(self, *parts: ast.Ident | None) -> ast.Ident:
        name = parts[-1]
        assert name is not None
        return name

    def table_function(self, name: Token, *rest: Any) -> ast.TableFunction:
        *args, alias = rest
        return ast.TableFunction(name.lower(), tuple(a for a in args if a is not None), alias)

    def table_name(self, name: ast.Ident, alias: ast.Ident | None) -> ast.TableName:
        return ast.TableName(name, None, alias)

    def qualified_table(
        self, schema: ast.Ident, name: ast.Ident, alias: ast.Ident | None
    ) -> ast.TableName:
        return ast.TableName(name, schema, alias)

    def where_clause(self, expr: ast.Expr) -> ast.Expr:
        return expr

    def order_clause(self, *items: ast.OrderItem) -> tuple[ast.OrderItem, ...]:
        return items

    def order_item(self, expr: ast.Expr, descending: bool | None) -> ast.OrderItem:
        return ast.OrderItem(expr, bool(descending))

    def asc(self) -> bool:
        return False

    def desc(self) -> bool:
        return True

    def limit_clause(self, tok: Token) -> int:
        if tok.type == "PARAM":
            _literal_placeholder(tok, "int")
            return 0
        _check_literal(tok)
        if not tok.isdigit():
            raise _PositionedError(f"LIMIT takes a non-negative integer, not {tok}", tok)
        return int(tok)

    def offset_clause(self, tok: Token) -> int:
        if tok.type == "PARAM":
            _literal_placeholder(tok, "int")
            return 0
        _check_literal(tok)
        if not tok.isdigit():
            raise _PositionedError(f"OFFSET takes a non-negative integer, not {tok}", tok)
        return int(tok)

    # ---- expressions
    def number(self, tok: Token) -> ast.Literal:
        _check_literal(tok)
        if tok.isdigit():
            return ast.Literal(int(tok))
        value = float(tok)
        if not math.isfinite(value):
            raise NumericOverflow(f"numeric literal {tok} is out of range for a double")
        return ast.Literal(value)

    def string(self, tok: Token) -> ast.Literal:
        return ast.Literal(_unquote(tok, "'"))

    def escape_string(self, tok: Token) -> ast.Literal:
        """``E'...'``: PostgreSQL's escape string (backslash escapes)."""
        body = tok[2:-1].replace("''", "'")
        return ast.Literal(_ESCAPES.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), body))

    def null(self) -> ast.Literal:
        return ast.Literal(None)

    def parameter(self, tok: Token) -> ast.Param:
        if not _placeholders.allowed:
            raise _PositionedParameter(f"there is no parameter {tok}", tok)
        return ast.Param(placeholder_number(tok[1:]))

    def true(self) -> ast.Literal:
        return ast.Literal(True)

    def false(self) -> ast.Literal:
        return ast.Literal(False)

    def column(self, name: ast.Ident) -> ast.Column:
        return ast.Column(name)

    def qualified_column(self, table: ast.Ident, name: ast.Ident) -> ast.Column:
        return ast.Column(name, table)

    def schema_column(self, schema: ast.Ident, table: ast.Ident, name: ast.Ident) -> ast.Column:
        """``pg_catalog.pg_class.relname``: the relation is found by its name in FROM."""
        return ast.Column(name, table)

    def ordered_call(
        self, name: Token, arg: ast.Expr, order_by: tuple[ast.OrderItem, ...]
    ) -> ast.Call:
        return ast.Call(name.lower(), (arg,), order_by=order_by)

    def any_eq(self, left: ast.Expr, array: ast.Expr) -> ast.Binary:
        return ast.Binary("= any", left, array)

    def subscript(self, array: ast.Expr, index: ast.Expr) -> ast.Call:
        """``a[i]``: the i-th element (1-based), NULL outside the array."""
        return ast.Call("array_element", (array, index))

    def array_type(self, words: str, brackets: Token) -> tuple[str, str]:
        return ARRAY, f"{words}[]"

    def qualified_table_function(
        self, schema: ast.Ident, name: Token, *rest: Any
    ) -> ast.TableFunction:
        if schema.text.lower() != "pg_catalog":
            raise UndefinedFunction(f"function {schema.text}.{name}() does not exist")
        return self.table_function(name, *rest)

    def window_call(
        self,
        name: Token,
        partition: tuple[ast.Expr, ...] | None,
        order_by: tuple[ast.OrderItem, ...] | None,
    ) -> ast.Window:
        if name.lower() != "row_number":
            raise _PositionedError(
                f"window function {name}() is not supported (row_number is)", name
            )
        return ast.Window("row_number", partition or (), order_by or ())

    def partition_clause(self, *exprs: ast.Expr) -> tuple[ast.Expr, ...]:
        return exprs

    def current_catalog(self) -> ast.Call:
        return ast.Call("current_database")

    def concat(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("||", left, right)

    def like_escape(self, left: ast.Expr, pattern: ast.Expr, escape: ast.Expr) -> ast.Binary:
        return ast.Binary("like", left, ast.Call("like_escape", (pattern, escape)))

    def not_like_escape(self, left: ast.Expr, pattern: ast.Expr, escape: ast.Expr) -> ast.Unary:
        return ast.Unary("not", self.like_escape(left, pattern, escape))

    def case(self, operand: ast.Expr | None, *rest: Any) -> ast.Case:
        *whens, default = rest
        return ast.Case(operand, tuple(whens), default)

    def when(self, condition: ast.Expr, result: ast.Expr) -> tuple[ast.Expr, ast.Expr]:
        return condition, result

    def scalar_subquery(self, select: ast.Select) -> ast.Subquery:
        return ast.Subquery("scalar", select)

    def exists(self, select: ast.Select) -> ast.Subquery:
        return ast.Subquery("exists", select)

    def array_subquery(self, select: ast.Select) -> ast.Subquery:
        return ast.Subquery("array", select)

    def collate(self, operand: ast.Expr, *_: object) -> ast.Expr:
        """COLLATE is accepted and ignored: text compares by code point here."""
        return operand

    def regex(self, left: ast.Expr, op: Token, right: ast.Expr) -> ast.Binary:
        return ast.Binary(str(op), left, right)

    def operator_regex(
        self, left: ast.Expr, schema: Token, op: Token, right: ast.Expr
    ) -> ast.Binary:
        """``OPERATOR(pg_catalog.~)``: the operator by its qualified name."""
        if schema.lower() != "pg_catalog":
            raise _PositionedError(f"operator does not exist: {schema}.{op}", schema)
        return ast.Binary(str(op), left, right)

    def is_distinct(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("distinct", left, right)

    def is_not_distinct(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("not distinct", left, right)

    def call_star(self, name: Token) -> ast.Call:
        return ast.Call(name.lower(), (), star=True)

    def call(self, name: Token, *args: ast.Expr | None) -> ast.Call:
        return ast.Call(name.lower(), tuple(a for a in args if a is not None))

    def qualified_call(self, schema: ast.Ident, name: Token, *args: ast.Expr | None) -> ast.Call:
        """``pg_catalog.version()``: the functions PostgreSQL keeps in pg_catalog are
        resgroups' own functions of those names; there is no other schema."""
        if schema.text.lower() != "pg_catalog":
            raise UndefinedFunction(
                f"function {schema.text}.{name}() does not exist: there is no schema "
                f'"{schema.text}" (functions are unqualified, or in pg_catalog)'
            )
        return self.call(name, *args)

    def current_timestamp(self) -> ast.Call:
        return ast.Call("current_timestamp")

    def current_user(self) -> ast.Call:
        return ast.Call("current_user")

    def session_user(self) -> ast.Call:
        return ast.Call("session_user")

    def current_schema(self, *_: object) -> ast.Call:
        return ast.Call("current_schema")

    def cast(self, operand: ast.Expr, target: tuple[str, str]) -> ast.Cast:
        return ast.Cast(operand, *target)

    def cast_call(self, operand: ast.Expr, target: tuple[str, str]) -> ast.Cast:
        return ast.Cast(operand, *target)

    def type_name(self, words: str, *modifiers: Token | None) -> tuple[str, str]:
        """(the semantics' type, the type as written)."""
        return cast_target(words, [str(m) for m in modifiers if m is not None])

    def two_word_type(self, first: Token, second: Token) -> str:
        words = f"{first} {second}".lower()
        if words not in ("double precision", "character varying"):
            raise UndefinedType(f'type "{words}" does not exist')
        return words

    def type_word(self, tok: Token) -> str:
        return str(tok).lower()

    def qualified_type_word(self, schema: Token, tok: Token) -> str:
        if schema.lower() != "pg_catalog":
            raise UndefinedType(f'type "{schema}.{tok}" does not exist')
        return str(tok).lower()

    def neg(self, operand: ast.Expr) -> ast.Unary:
        return ast.Unary("-", operand)

    def not_(self, operand: ast.Expr) -> ast.Unary:
        return ast.Unary("not", operand)

    def is_null(self, operand: ast.Expr) -> ast.IsNull:
        return ast.IsNull(operand)

    def is_not_null(self, operand: ast.Expr) -> ast.IsNull:
        return ast.IsNull(operand, negated=True)

    def in_list(self, operand: ast.Expr, *items: ast.Expr) -> ast.InList:
        return ast.InList(operand, items)

    def not_in_list(self, operand: ast.Expr, *items: ast.Expr) -> ast.InList:
        return ast.InList(operand, items, negated=True)

    def not_like(self, left: ast.Expr, right: ast.Expr) -> ast.Unary:
        return ast.Unary("not", ast.Binary("like", left, right))

    or_ = _binary("or")
    and_ = _binary("and")
    eq = _binary("=")
    ne = _binary("<>")
    lt = _binary("<")
    le = _binary("<=")
    gt = _binary(">")
    ge = _binary(">=")
    like = _binary("like")
    add = _binary("+")
    sub = _binary("-")
    mul = _binary("*")
    div = _binary("/")
    mod = _binary("%")

    # ---- executor tables
    def create_table_as(self, name: ast.Ident, query: ast.Select) -> ast.CreateTableAs:
        return ast.CreateTableAs(name, query)

    def insert_select(self, name: ast.Ident, query: ast.Select) -> ast.InsertSelect:
        return ast.InsertSelect(name, query)

    def drop_table(self, if_exists: bool | None, name: ast.Ident) -> ast.DropTable:
        return ast.DropTable(name, bool(if_exists))

    # ---- the script
    def script(self, *statements: ast.Statement | None) -> list[ast.Statement]:
        return [s for s in statements if s is not None]


_ESCAPES: Final = re.compile(r"\\(.)", re.DOTALL)
_ESCAPED: Final = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


# what ALTER and DROP RESOURCE ... name besides GROUP (read as names: not reserved)
RESOURCE_OBJECTS: Final = ("rule", "selector")


def _resource_object(word: Token, allowed: tuple[str, ...]) -> str:
    """``RULE`` after RESOURCE (any case); a syntax error naming what may follow."""
    kind = str(word).lower()
    if kind not in allowed:
        shown = ", ".join(f"RESOURCE {w.upper()}" for w in ("group", *allowed))
        raise _PositionedError(f"unexpected {str(word)!r} after RESOURCE: expected {shown}", word)
    return kind


def _no_repeats(params: tuple[tuple[str, ast.ParamValue], ...]) -> tuple[Any, ...]:
    names = [name for name, _ in params]
    for name in names:
        if names.count(name) > 1:
            raise InvalidParameter(f"parameter {name} is given more than once")
    return params


def warm() -> None:
    """Build the parser now (about a second of LALR tables), not in the first
    statement's time: what a server does before it says it is ready."""
    _parser()


# A directory where the built LALR tables may be kept between processes (opt-in;
# the test suite sets it for the servers and nodes it starts). Unset, every
# process builds its own tables, as before. The file is a pickle: name only a
# directory no one else may write to.
PARSER_CACHE_ENV: Final = "RESGROUPS_PARSER_CACHE"


def _build(grammar: str, cache_file: str | None = None) -> Lark:
    options: dict[str, Any] = {} if cache_file is None else {"cache": cache_file}
    return Lark(
        grammar,
        parser="lalr",
        lexer="basic",
        transformer=_ToAst(),
        start="script",
        maybe_placeholders=True,
        **options,
    )


def _build_cached(grammar: str, directory: str) -> Lark:
    """The parser, its tables loaded from ``directory`` when a process (of the same
    grammar, Lark and Python) has kept them there, else built and kept there.
    Lark names what it keeps by a digest of all three (checked again on loading);
    a lock beside the file lets one process at a time read or write it, so
    processes starting together never read half of one."""
    digest = hashlib.sha256(
        "\0".join((grammar, lark_version, repr(sys.version_info[:2]))).encode()
    ).hexdigest()[:24]
    path = os.path.join(directory, f"resgroups-parser-{digest}.lark")
    try:
        lock = open(path + ".lock", "a")  # noqa: SIM115 (the with below closes it)
    except OSError:
        return _build(grammar)  # no such directory, read-only: built as if unset
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(grammar, path)


@cache
def _parser() -> Lark:
    grammar = resources.files("resgroups.sql").joinpath("grammar.lark").read_text("utf-8")
    directory = os.environ.get(PARSER_CACHE_ENV)
    lark = _build_cached(grammar, directory) if directory else _build(grammar)
    # every terminal ticks the interrupt counter (a call per token, ~1 % of a parse)
    lark.lexer_conf.callbacks = dict.fromkeys((t.name for t in lark.terminals), _tick)
    lark.parser.lexer = BasicLexer(lark.lexer_conf)
    # Lark.lex() builds a new lexer on every call (~8 ms) unless one is kept here;
    # the shell lexes every line it reads to find where statements end.
    lark.lexer = lark._build_lexer()
    return lark


_TOKEN_NAMES: Final = {
    "NAME": "identifier",
    "QUOTED_NAME": "quoted identifier",
    "STRING": "string",
    "NUMBER": "number",
    "$END": "end of input",
}


@cache
def _display_names() -> dict[str, str]:
    names = dict(_TOKEN_NAMES)
    for term in _parser().terminals:
        if term.name in names:
            continue
        if isinstance(term.pattern, PatternStr):
            value = term.pattern.value
            names[term.name] = value.upper() if value.isalpha() else f"'{value}'"
        else:
            names[term.name] = term.name.lower()
    return names


def _expected(names: set[str] | frozenset[str]) -> list[str]:
    display = _display_names()
    return sorted({display.get(n, n) for n in names})


_CONTEXT_CHARS: Final = 60  # shown on each side of the caret: a long line is cut


def _caret(text: str, pos: int) -> tuple[int, int, str]:
    """1-based line and column of ``pos``, and that line (cut to a window around
    ``pos`` when long, so an error never echoes a huge statement) with a caret."""
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    source_line = text[start : end if end >= 0 else len(text)]
    column = pos - start + 1
    left = max(0, column - 1 - _CONTEXT_CHARS)
    right = min(len(source_line), column - 1 + _CONTEXT_CHARS)
    prefix = "..." if left else ""
    shown = prefix + source_line[left:right] + ("..." if right < len(source_line) else "")
    return line, column, f"{shown}\n{' ' * (len(prefix) + column - 1 - left)}^"


def _syntax_error(text: str, message: str, pos: int, expected: list[str]) -> SqlSyntaxError:
    line, column, context = _caret(text, pos)
    return SqlSyntaxError(
        message, line=line, column=column, expected=expected, context=context, position=pos
    )


# a password literal, possibly unterminated: its text must never reach an error
_PASSWORD_LITERAL: Final = re.compile(r"\bpassword(\s+)'((?:[^']|'')*)", re.IGNORECASE)


def redact_passwords(text: str) -> str:
    """``text`` with every password literal's characters masked (same length and
    lines, so positions, lines and carets stay true)."""

    def mask(match: re.Match[str]) -> str:
        secret = match.group(2)
        return match.group(0)[: match.start(2) - match.start(0)] + re.sub(r"[^\n]", "*", secret)

    return _PASSWORD_LITERAL.sub(mask, text)


def _describe(token: Token, text: str) -> str:
    name = _display_names().get(token.type, token.type)
    if token.type == "$END":
        return "end of input"
    if token.type in ("NAME", "QUOTED_NAME", "STRING", "NUMBER"):
        shown = (
            text[token.start_pos : token.end_pos]
            if token.start_pos is not None and token.end_pos is not None
            else str(token)
        )
        return f"{name} {shown}"
    return f"keyword {name}" if name.isalpha() else f"{name}"


def _translate(text: str, exc: UnexpectedInput) -> SqlSyntaxError:
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        if token.type == "$END":
            return _syntax_error(
                text, "unexpected end of input", len(text.rstrip()), _expected(exc.expected)
            )
        message = f"unexpected {_describe(token, text)}"
        if "NAME" in exc.expected and str(token).isidentifier():
            message += f' (keywords are reserved: write "{token}" to use it as a name)'
        pos = token.start_pos if token.start_pos is not None else len(text)
        return _syntax_error(text, message, pos, _expected(exc.expected))
    if isinstance(exc, UnexpectedCharacters):
        at = exc.pos_in_stream or 0
        char = text[at] if at < len(text) else ""
        message = {
            "'": "unterminated string literal",
            '"': "unterminated quoted identifier",
        }.get(char, f"unexpected character {char!r}")
        return _syntax_error(text, message, at, _expected(exc.allowed or set()))
    pos = getattr(exc, "pos_in_stream", None) or len(text)
    return _syntax_error(text, "syntax error", pos, [])


def parse_script(text: str) -> list[ast.Statement]:
    """Every statement of ``text`` (separated by ``;``), in order.

    Raises :class:`SqlSyntaxError` (with line, column, expected tokens and a
    caret) or :class:`InvalidParameter` for a bad parameter value.
    """
    if len(text) > MAX_SCRIPT_CHARS:
        raise ProgramLimitExceeded(
            f"statement text of {len(text):,} characters exceeds the limit of {MAX_SCRIPT_CHARS:,}"
        )
    try:
        result: list[ast.Statement] = _parser().parse(text)  # type: ignore[assignment]
    except UnexpectedInput as exc:  # errors are drawn on the text with passwords masked
        raise _translate(redact_passwords(text), exc) from None
    except _PositionedError as exc:
        pos = exc.token.start_pos if exc.token.start_pos is not None else 0
        error = _syntax_error(redact_passwords(text), exc.message, pos, [])
        if isinstance(exc, _PositionedLimit):
            raise ProgramLimitExceeded(str(error)) from None
        if isinstance(exc, _PositionedParameter):
            raise UndefinedParameter(str(error)) from None
        raise error from None
    if len(text) > MAX_DEPTH // 2:  # shorter text cannot nest that deep
        for stmt in result:
            _check_depth(stmt)
    return result


def _check_depth(stmt: ast.Statement) -> None:
    """ProgramLimitExceeded if ``stmt`` nests deeper than MAX_DEPTH (an explicit
    stack: the check itself never recurses)."""
    stack: list[tuple[object, int]] = [(stmt, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ProgramLimitExceeded(
                f"expression nesting depth exceeds the limit of {MAX_DEPTH} "
                "(parentheses, operators and calls nested inside each other)"
            )
        if isinstance(node, tuple | list):
            stack.extend((child, depth) for child in node)
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            stack.extend((getattr(node, f.name), depth + 1) for f in dataclasses.fields(node))


def parse_one(text: str) -> ast.Statement:
    """Exactly one statement, or SqlSyntaxError."""
    statements = parse_script(text)
    if len(statements) != 1:
        raise _syntax_error(
            redact_passwords(text),
            f"expected exactly one statement, found {len(statements)}",
            0,
            [],
        )
    return statements[0]


def keywords() -> list[str]:
    """Every reserved keyword, upper-case (for completion and documentation)."""
    return sorted(
        name for name in set(_display_names().values()) if name.isalpha() and name.isupper()
    )
