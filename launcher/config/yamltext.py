"""Inventory YAML as the parser needs it: data, the line of every entry ("hosts[1]" -> 7), the text of plain
scalars as typed (`010` stays "010", not 8), secret entries' nodes (no error quotes them), and refusals of what
would cost too much to read (merge-key bombs, deep nesting). PyYAML's SafeLoader underneath."""

from __future__ import annotations

from typing import Any

import yaml

from launcher.config.text import SHOWN, render, shorten
from launcher.errors import InventoryError
from launcher.limits import MAX_MERGED_PAIRS

_STR_TAG = "tag:yaml.org,2002:str"


_BOOL_TAG = "tag:yaml.org,2002:bool"


_MERGE_TAG = "tag:yaml.org,2002:merge"


_FALSE = ("false", "no", "off")
"""How YAML 1.1 spells false (any case)."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that notes which scalars were plain, and whose bad scalars (`2024-13-01`, `!!int abc`) fail as
    YAML errors with a line, not ValueError."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.guessed: set[int] = set()
        """ids of plain, untagged scalar nodes: YAML 1.1 typed them from their text (`010` -> 8, `yes` -> True)."""
        self.hidden: set[int] = set()
        """ids of the nodes of env entries with `secret:`, whose text no error may quote."""

    # types-PyYAML calls `anchor` a dict of nodes; PyYAML passes the anchor's name (or None) here.
    def compose_scalar_node(self, anchor: str | None) -> yaml.ScalarNode:  # type: ignore[override]
        event = self.peek_event()
        node = super().compose_scalar_node(anchor)  # type: ignore[arg-type]
        if event.tag in (None, "!") and event.implicit[0]:  # no quotes, no `!!tag`: the type is YAML's guess
            self.guessed.add(id(node))
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError) as exc:
            what = "(not shown: the entry is secret)"  # the exception's text quotes the value too
            if id(node) not in self.hidden:
                text = node.value if isinstance(node, yaml.ScalarNode) else "..."  # a collection's repr can be a bomb
                what = f"{render(text)} ({shorten(str(exc), SHOWN)})"
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shorten(node.tag.rsplit(':', 1)[-1], SHOWN)} value {what}", node.start_mark
            ) from None


def _yaml_error(exc: yaml.YAMLError, text: str, source: str) -> InventoryError:
    """PyYAML's error as one line: the problem, where it is, and where the construct it was reading began."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow; it knows only the offset
        line = text.count("\n", 0, exc.position) + 1
        return InventoryError(source, f"not valid YAML: character {chr(exc.character)!r} is not allowed", line=line)
    mark = getattr(exc, "problem_mark", None)
    problem = shorten(getattr(exc, "problem", None) or " ".join(str(exc).split()), 4 * SHOWN)  # may quote a tag
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark and (not mark or context_mark.line != mark.line):
        problem += f" ({context} on line {context_mark.line + 1})"
    return InventoryError(source, f"not valid YAML: {problem}", line=mark.line + 1 if mark else None)


def _refuse_merge_bombs(root: yaml.Node | None, source: str) -> None:
    """Refuse a document whose merge keys would expand past `MAX_MERGED_PAIRS` pairs, before PyYAML copies them.

    A plain alias costs nothing (the constructed object is shared), but each `<<` copies the merged mappings' pairs
    into the node that merges them: 22 levels of `{<<: [*prev, *prev]}` are 4 million pairs, 20 s and 175 MB.
    Counted once per node, as PyYAML builds each node once.
    """
    sizes: dict[int, int] = {}
    total = 0

    def size(node: yaml.MappingNode) -> int:  # pairs of this mapping once flattened, as flatten_mapping builds them
        nonlocal total
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 0  # a mapping that merges itself: PyYAML's own recursion is refused later
        count = 0
        for key, value in node.value:
            merged = [value] if isinstance(value, yaml.MappingNode) else getattr(value, "value", ())
            if key.tag == _MERGE_TAG:
                count += sum(size(m) for m in merged if isinstance(m, yaml.MappingNode))
            else:
                count += 1
        sizes[id(node)] = count
        total += count
        if total > MAX_MERGED_PAIRS:
            raise InventoryError(
                source,
                f"not valid YAML: merge keys (<<) expand the mappings to more than {MAX_MERGED_PAIRS} entries",
                line=node.start_mark.line + 1,
            )
        return count

    seen: set[int] = set()
    stack = [] if root is None else [root]
    while stack:  # every mapping, each once (an alias is the same node)
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            size(node)
            stack += [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


def _line_numbers(node: yaml.Node | None, source: str, hidden: set[int]) -> dict[str, int]:
    """Map each entry path ("hosts[1].port") to its line; refuse duplicate keys, which YAML would drop silently
    (without quoting a key of a secret entry, the nodes in `hidden` or one that says `secret:`)."""
    lines: dict[str, int] = {}
    walked: set[int] = set()

    def walk(n: yaml.Node, path: str) -> None:
        lines.setdefault(path, n.start_mark.line + 1)
        if id(n) in walked:  # an alias: walked where its anchor is (it may contain itself, or nest exponentially)
            return
        walked.add(id(n))
        if isinstance(n, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in n.value:
                if not isinstance(key, yaml.ScalarNode):  # constructing refuses it (unhashable); its text may be a bomb
                    continue
                name = str(key.value)
                child = f"{path}.{name}" if path else name
                if name in seen and (id(n) in hidden or _says_secret(n)):
                    raise InventoryError(
                        source,
                        "has a key twice (not shown: the entry is secret)",
                        entry=shorten(path, 2 * SHOWN) or None,
                        line=key.start_mark.line + 1,
                    )
                if name in seen:
                    raise InventoryError(
                        source,
                        "appears twice in the same mapping",
                        entry=shorten(child, 2 * SHOWN),
                        line=key.start_mark.line + 1,
                    )
                seen.add(name)
                lines[child] = key.start_mark.line + 1
                walk(value, child)
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                walk(item, f"{path}[{i}]")

    if node is not None:
        walk(node, "")
    return lines


def _says_secret(node: yaml.MappingNode) -> bool:
    """Whether a mapping (an env entry) has `secret:` with anything but false: a malformed flag hides too."""
    return any(
        isinstance(k, yaml.ScalarNode)
        and k.value == "secret"
        and not (isinstance(v, yaml.ScalarNode) and v.tag == _BOOL_TAG and v.value.lower() in _FALSE)
        for k, v in node.value
    )


def is_secret(value: dict[Any, Any]) -> bool:
    """Whether a loaded mapping (an env entry) has `secret:` with anything but false, as `_says_secret`."""
    return "secret" in value and value["secret"] is not False


def _secret_nodes(root: yaml.Node | None) -> set[int]:
    """ids of every node inside an env entry that says `secret:`, or a host's entry for a name that the defaults'
    env marks secret: what no error may quote."""
    hidden: set[int] = set()
    seen: set[tuple[int, bool]] = set()  # a node is visited at most twice (open, secret): aliases may nest 10**9 deep
    stack: list[tuple[yaml.Node, bool]] = [] if root is None else [(root, False)]
    top = _pairs(root)
    names = {
        name
        for name, node in _pairs(_pairs(top.get("defaults")).get("env")).items()
        if isinstance(node, yaml.MappingNode) and _says_secret(node)
    }
    hosts = top.get("hosts")
    for host in hosts.value if isinstance(hosts, yaml.SequenceNode) and names else ():
        stack += [(node, True) for name, node in _pairs(_pairs(host).get("env")).items() if name in names]
    while stack:
        node, secret = stack.pop()
        if (id(node), secret) in seen:
            continue
        seen.add((id(node), secret))
        if secret:
            hidden.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack += [(item, secret) for item in node.value]
        elif isinstance(node, yaml.MappingNode):
            inner = secret or _says_secret(node)
            stack += [(value, inner) for _, value in node.value]
    return hidden


def _pairs(node: yaml.Node | None) -> dict[str, yaml.Node]:
    """A mapping node's values by string key; the last one wins, as in the dict that YAML builds from it."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.tag == _STR_TAG}


def _written_texts(root: yaml.Node | None, guessed: set[int]) -> dict[str, str]:
    """Entry -> source text of each plain job argument, env value and setup line: `010` stays 010, not 8.

    Runs on the constructed nodes, whose merge keys (`<<`) are resolved in place, so paths match the data.
    """
    top = _pairs(root)
    found: dict[str, yaml.Node | None] = {}
    for key in ("args", "resume_args"):
        items = _pairs(top.get("job")).get(key)
        if isinstance(items, yaml.SequenceNode):
            found.update((f"job.{key}[{i}]", item) for i, item in enumerate(items.value))
    found["rendezvous.nodes"] = _pairs(top.get("rendezvous")).get("nodes")
    for name, node in _pairs(_pairs(top.get("rendezvous")).get("conf")).items():
        found[f"rendezvous.conf.{name}"] = node
    sections = {"defaults": top.get("defaults")}
    hosts = top.get("hosts")
    if isinstance(hosts, yaml.SequenceNode):
        sections.update((f"hosts[{i}]", host) for i, host in enumerate(hosts.value))
    for entry, section in sections.items():
        for name, node in _pairs(_pairs(section).get("env")).items():
            found[f"{entry}.env.{name}"] = node
            found[f"{entry}.env.{name}.value"] = _pairs(node).get("value")
        setup = _pairs(section).get("setup")
        found[f"{entry}.setup"] = setup
        if isinstance(setup, yaml.SequenceNode):
            found.update((f"{entry}.setup[{i}]", line) for i, line in enumerate(setup.value))
    return {
        entry: node.value for entry, node in found.items() if isinstance(node, yaml.ScalarNode) and id(node) in guessed
    }


def load_yaml(text: str, source: str) -> tuple[Any, dict[str, int], dict[str, str]]:
    """Inventory YAML text -> (data, line of each entry, the text of each plain scalar where it matters); every
    problem (bad YAML, a merge-key bomb, nesting too deep) raises `InventoryError` naming source and line."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        root_node = loader.get_single_node()
        _refuse_merge_bombs(root_node, source)  # PyYAML copies what `<<` merges: sizes can double per level
        loader.hidden = _secret_nodes(root_node)
        lines = _line_numbers(root_node, source, loader.hidden)  # before constructing, which rewrites `<<` in place
        data = None if root_node is None else loader.construct_document(root_node)
        written = _written_texts(root_node, loader.guessed)  # after: merge keys are resolved in the nodes as in data
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, source) from None
    except RecursionError:
        raise InventoryError(source, "not valid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, lines, written
