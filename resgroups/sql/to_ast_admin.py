"""The administration statements' half of the parser's transformer: resource
groups and their variants, runaway-query rules, selectors, principals and
their mappings, grants, SET/RESET/DISCARD, EXPLAIN RESOURCE GROUP and SHOW,
with the parameter values they take (checked and typed as they are reduced).
"""

from __future__ import annotations

from typing import Any, Final

from lark import Token, Transformer, v_args

from resgroups.catalog.params import INT32_MAX, RawValue, lookup, parse_param, parse_size
from resgroups.catalog.rules import KILL, LOG, MOVE, parse_watch
from resgroups.catalog.rules import metric as rule_metric
from resgroups.catalog.selectors import ATTRIBUTES as SELECTOR_ATTRIBUTES
from resgroups.catalog.selectors import KINDS as SELECTOR_KINDS
from resgroups.catalog.selectors import condition_problem as selector_condition_problem
from resgroups.errors import InvalidParameter, did_you_mean
from resgroups.sql import ast
from resgroups.sql.params import placeholder_number
from resgroups.sql.to_ast_common import (
    _check_literal,
    _literal_placeholder,
    _placeholders,
    _PositionedError,
    _unquote,
)

# resource group options whose value is an integer (the others take text too:
# sizes, durations, percentages, names)
_INTEGER_OPTIONS: Final = frozenset({"cpu_weight", "max_active_queries", "max_queued_queries"})

# what ALTER and DROP RESOURCE ... name besides GROUP (read as names: not reserved)
RESOURCE_OBJECTS: Final = ("rule", "selector")


@v_args(inline=True)
class AdminToAst(Transformer[Token, Any]):
    """The administration statements' callbacks, one a grammar rule (a part of
    ``parser._ToAst``; ``v_args`` here, as the decorator skips inherited methods)."""

    # ---- resource group names
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
