"""The hosts inventory: YAML text -> a validated, typed `Cluster` (pure: no DNS, no SSH, no files but the one read)."""

from __future__ import annotations

import difflib
import os.path
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from launcher.config.elastic import DEFAULT_RESUME_ARGS, ELASTIC_KEYS, Elastic, ElasticFields
from launcher.config.fields import ENV_FILE_KEYS as ENV_FILE_KEYS  # re-exported: the inventory's names
from launcher.config.fields import FORWARD_ENV_KEYS as FORWARD_ENV_KEYS
from launcher.config.fields import RESERVED_ENV as RESERVED_ENV
from launcher.config.fields import SYNC_KEYS as SYNC_KEYS
from launcher.config.fields import EnvFile, ForwardEnv, NodeFields, SyncSpec, reserved_reason
from launcher.errors import InventoryError
from launcher.options import MAX_NPROC_PER_NODE

HostKeyPolicy = Literal["strict", "accept-new"]
HOST_KEY_POLICIES: tuple[str, ...] = ("strict", "accept-new")
DEFAULT_MASTER_PORT = 29500

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# ssh aliases, DNS names, IPv4 and IPv6 literals; never starting with '-' (it would read as an ssh option).
_HOST_NAME = re.compile(r"[A-Za-z0-9_:\[][A-Za-z0-9_.:%\[\]-]*\Z")
_STR_TAG = "tag:yaml.org,2002:str"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_SHOWN = 70
"""At most this many characters of a value in a message (entries get twice that)."""
_MAX_MERGED = 100_000
"""At most this many key/value pairs in all mappings together once merge keys (`<<`) are expanded: a few hundred
hosts of a few dozen keys stay far below it; a merge-key bomb (each level merging the one before twice) does not."""
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BRACKETS: dict[type, str] = {list: "[]", tuple: "()", set: "{}"}
_FALSE = ("false", "no", "off")
"""How YAML 1.1 spells false (any case)."""


@dataclass(frozen=True)
class EnvVar:
    """One environment variable set for torchrun on a node."""

    name: str
    value: str | None = None
    """The literal value, or None when it is read from the controller's environment."""
    from_env: str | None = None
    """Name of the controller's environment variable to copy at launch time."""
    secret: bool = False
    """Never shown in argv, dry-runs or logs; sent over stdin and kept in a 0600 file on the node."""


@dataclass(frozen=True)
class Host:
    """One node of the cluster."""

    name: str
    """How the controller reaches it: an ssh alias (from ssh config) or an address."""
    addr: str
    """How the other nodes reach it (defaults to `name`); also what the doctor resolves on every node."""
    python: str
    """The interpreter on the node; torchrun runs as `PYTHON -m torch.distributed.run`."""
    workdir: str
    """Directory on the node where the job's script lives and torchrun starts."""
    nproc_per_node: int | Literal["auto"]
    """Worker processes on this node (usually its GPU count), or "auto" (torchrun decides)."""
    user: str | None = None
    """ssh user; None leaves it to ssh config (then the local user)."""
    port: int | None = None
    """ssh port; None leaves it to ssh config (then 22)."""
    identity_file: str | None = None
    """ssh private key; ssh config and ssh-agent are honoured too."""
    env: tuple[EnvVar, ...] = ()
    """Extra environment for torchrun on this node (defaults' env merged with the host's); it wins over the rest."""
    setup: tuple[str, ...] = ()
    """Shell lines run on the node before torchrun (and the doctor's probe), in the same shell, as written."""
    forward_env: tuple[ForwardEnv, ...] = ()
    """Controller variables copied at launch, by glob (defaults' list, then the host's); `env` wins over them."""
    env_file: EnvFile | None = None
    """A dotenv file read on the controller at launch; forwarded variables and `env` win over its values."""
    socket_ifname: str | None = None
    """NCCL_/GLOO_SOCKET_IFNAME on the node: an interface, or "auto" (the one it routes to master_addr through)."""


@dataclass(frozen=True)
class Rendezvous:
    """Where torchrun's rendezvous store listens (on the first node by default), and how the group forms."""

    master_addr: str
    master_port: int = DEFAULT_MASTER_PORT
    master_addr_explicit: bool = False
    """Whether the inventory set master_addr; when it did not, it follows the first host (see `select_hosts`)."""
    elastic: Elastic = field(default_factory=Elastic)
    """static (every node, fixed ranks) or c10d with MIN:MAX nodes; torchrun's own restarts."""


@dataclass(frozen=True)
class Job:
    """What torchrun runs on every node."""

    script: str
    """Path of the training script, relative to each node's workdir (or absolute)."""
    args: tuple[str, ...] = ()
    """Arguments for the script, passed byte for byte."""
    resume_args: tuple[str, ...] = DEFAULT_RESUME_ARGS
    """Added to `args` when the launcher retries a failed run (`retries`): how the script resumes its checkpoint."""


@dataclass(frozen=True)
class Cluster:
    """A validated inventory: the nodes in rank order, the rendezvous point and the job."""

    source: str
    """The file it was read from (for messages)."""
    hosts: tuple[Host, ...]
    rendezvous: Rendezvous
    job: Job | None = None
    ssh_config: str | None = None
    """An ssh config file to read instead of ~/.ssh/config."""
    host_key_policy: HostKeyPolicy = "strict"
    """strict: only hosts in known_hosts; accept-new: learn an unknown host's key once, refuse a changed one."""
    sync: SyncSpec | None = None
    """What to copy from the controller to every node (`sync:`); None: nothing."""
    retries: int = 0
    """How often the launcher relaunches a run that lost a node (`retries:`; `inv launch --retries` wins)."""
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)
    """Line numbers of entries in the source ("hosts[1]" -> 7), for messages of later checks."""

    def host(self, name: str) -> Host:
        """The host called `name` (KeyError if there is none)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    @property
    def world_size(self) -> int | None:
        """Total worker processes, or None when some node says "auto"."""
        counts = [h.nproc_per_node for h in self.hosts]
        return None if "auto" in counts else sum(int(c) for c in counts)


TOP_KEYS = ("defaults", "hosts", "rendezvous", "job", "ssh_config", "host_key_policy", "sync", "retries")
HOST_KEYS = ("user", "port", "identity_file", "python", "workdir", "nproc_per_node", "env", "setup", "forward_env",
             "env_file", "socket_ifname")
RENDEZVOUS_KEYS = ("master_addr", "master_port", *ELASTIC_KEYS)
JOB_KEYS = ("script", "args", "resume_args")
ENV_KEYS = ("value", "from_env", "secret")
DEFAULTS: dict[str, Any] = {"python": "python3", "workdir": "~", "nproc_per_node": 1}


def load_inventory(path: str | Path) -> Cluster:
    """Read and validate the inventory file at `path`."""
    return parse_inventory(read_hosts_file(path), str(path))


def read_hosts_file(path: str | Path) -> str:
    """The text of an inventory or hostfile; a missing or unreadable file is an `InventoryError`."""
    source = str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(source, "no such file (see hosts/example.yaml for the format)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(source, f"cannot read it: {exc}") from None


def cluster_from_data(data: Any, source: str, lines: Mapping[str, int] | None = None,
                      folder: str | None = None) -> Cluster:
    """Validate an inventory already loaded as Python data (a hostfile builds one), exactly as YAML text would be.

    `lines` maps entries ("hosts[1]") to lines of `source`; `folder` is where a relative env_file is (default: the
    folder of `source`).
    """
    return _Parser(source, dict(lines or {}), {}, folder).cluster(data)


def is_host_name(text: str) -> bool:
    """Whether `text` is acceptable as a host name, ssh alias or address (never starting with '-')."""
    return bool(_HOST_NAME.match(text))


class _Loader(yaml.SafeLoader):
    """SafeLoader that notes which scalars were plain, and whose bad scalars (`2024-13-01`, `!!int abc`) fail as
    YAML errors with a line, not ValueError."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.guessed: set[int] = set()
        """ids of plain, untagged scalar nodes: YAML 1.1 typed them from their text (`010` -> 8, `yes` -> True)."""
        self.hidden: set[int] = set()
        """ids of the nodes of env entries with `secret:`, whose text no error may quote."""

    def compose_scalar_node(self, anchor: str | None) -> yaml.ScalarNode:
        event = self.peek_event()
        node = super().compose_scalar_node(anchor)
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
                what = f"{_render(text)} ({_shorten(str(exc), _SHOWN)})"
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {_shorten(node.tag.rsplit(':', 1)[-1], _SHOWN)} value {what}",
                node.start_mark) from None


def parse_inventory(text: str, source: str = "<inventory>") -> Cluster:
    """Validate inventory YAML text; every problem raises `InventoryError` naming source, line, entry, field."""
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
    return _Parser(source, lines, written).cluster(data)


def _yaml_error(exc: yaml.YAMLError, text: str, source: str) -> InventoryError:
    """PyYAML's error as one line: the problem, where it is, and where the construct it was reading began."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow; it knows only the offset
        line = text.count("\n", 0, exc.position) + 1
        return InventoryError(source, f"not valid YAML: character {chr(exc.character)!r} is not allowed", line=line)
    mark = getattr(exc, "problem_mark", None)
    problem = _shorten(getattr(exc, "problem", None) or " ".join(str(exc).split()), 4 * _SHOWN)  # may quote a tag
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark and (not mark or context_mark.line != mark.line):
        problem += f" ({context} on line {context_mark.line + 1})"
    return InventoryError(source, f"not valid YAML: {problem}", line=mark.line + 1 if mark else None)


def _refuse_merge_bombs(root: yaml.Node | None, source: str) -> None:
    """Refuse a document whose merge keys would expand past `_MAX_MERGED` pairs, before PyYAML copies them.

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
        if total > _MAX_MERGED:
            raise InventoryError(source, f"not valid YAML: merge keys (<<) expand the mappings to more than "
                                 f"{_MAX_MERGED} entries", line=node.start_mark.line + 1)
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
                    raise InventoryError(source, "has a key twice (not shown: the entry is secret)",
                                         entry=_shorten(path, 2 * _SHOWN) or None, line=key.start_mark.line + 1)
                if name in seen:
                    raise InventoryError(source, "appears twice in the same mapping",
                                         entry=_shorten(child, 2 * _SHOWN), line=key.start_mark.line + 1)
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
    return any(isinstance(k, yaml.ScalarNode) and k.value == "secret"
               and not (isinstance(v, yaml.ScalarNode) and v.tag == _BOOL_TAG and v.value.lower() in _FALSE)
               for k, v in node.value)


def _is_secret(value: dict[Any, Any]) -> bool:
    """Whether a loaded mapping (an env entry) has `secret:` with anything but false, as `_says_secret`."""
    return "secret" in value and value["secret"] is not False


def _secret_nodes(root: yaml.Node | None) -> set[int]:
    """ids of every node inside an env entry that says `secret:`, or a host's entry for a name that the defaults'
    env marks secret: what no error may quote."""
    hidden: set[int] = set()
    seen: set[tuple[int, bool]] = set()  # a node is visited at most twice (open, secret): aliases may nest 10**9 deep
    stack: list[tuple[yaml.Node, bool]] = [] if root is None else [(root, False)]
    top = _pairs(root)
    names = {name for name, node in _pairs(_pairs(top.get("defaults")).get("env")).items()
             if isinstance(node, yaml.MappingNode) and _says_secret(node)}
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
        words = _pairs(top.get("job")).get(key)
        if isinstance(words, yaml.SequenceNode):
            found.update((f"job.{key}[{i}]", item) for i, item in enumerate(words.value))
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
    return {entry: node.value for entry, node in found.items()
            if isinstance(node, yaml.ScalarNode) and id(node) in guessed}


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _render(value: Any, limit: int = _SHOWN) -> str:
    """`repr(value)` cut at `limit` characters, built piece by piece: an alias bomb (10**9 leaves) costs no more."""
    out: list[str] = []
    size = 0
    for piece in _repr_pieces(value, limit):
        out.append(piece)
        size += len(piece)
        if size > limit:
            break
    return _shorten("".join(out), limit)


def _repr_pieces(value: Any, limit: int) -> Iterator[str]:
    """The pieces of `repr(value)` in order, lazily; every container yields a bracket before going deeper, so
    `_render` stops after at most `limit` levels even in a list that contains itself."""
    if isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield ", " if i else ""
            yield from _repr_pieces(key, limit)
            yield ": "
            yield from _repr_pieces(item, limit)
        yield "}"
    elif type(value) in _BRACKETS and value:  # YAML builds lists, sets (`!!set`) and tuples (`!!omap`)
        opening, closing = _BRACKETS[type(value)]
        yield opening
        for i, item in enumerate(value):
            yield ", " if i else ""
            yield from _repr_pieces(item, limit)
        yield ",)" if type(value) is tuple and len(value) == 1 else closing
    elif isinstance(value, str | bytes):
        yield repr(value[: limit + 1])  # longer than the limit either way, and never copied whole
    else:
        yield repr(value)


def _describe(value: Any) -> str:
    return "nothing" if value is None else f"{_render(value)} ({type(value).__name__})"


class _Parser(NodeFields, ElasticFields):
    """Turns the loaded YAML into typed objects; knows where each entry was, to say so in errors."""

    def __init__(self, source: str, lines: dict[str, int], written: Mapping[str, str], folder: str | None = None):
        self.source = source
        self.lines = lines
        self.written = written
        """Entry -> the source text of a plain job argument, env value or setup line (see `_written_texts`)."""
        self.folder = os.path.dirname(source) if folder is None else folder
        """What a relative env_file is relative to: the inventory's folder."""

    def fail(self, entry: str, message: str) -> InventoryError:
        line = self.lines.get(entry)
        parent = entry
        while line is None and parent:  # fall back to the nearest enclosing entry that has a line
            shorter = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", parent)
            parent = shorter if shorter != parent else ""  # a top-level name, or a key we cannot split: the root
            line = self.lines.get(parent)
        return InventoryError(self.source, message, entry=_shorten(entry, 2 * _SHOWN) or None, line=line)

    def mapping(self, value: Any, entry: str, allowed: tuple[str, ...], secret: bool = False) -> dict[str, Any]:
        """`value` as a mapping of `allowed` keys; an unknown key of a `secret` mapping, or of one that says
        `secret:`, is not quoted (`{secret: true, hf_...}`, `value:` forgotten, makes the token a key)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(entry, f"must be a mapping, got {_describe(value)}")
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(allowed)}"
                where = f"{entry}.{key}" if entry else str(key)
                if secret or _is_secret(value):  # no did-you-mean either: it would say what the secret resembles
                    line = self.lines.get(where)
                    raise InventoryError(self.source, "has an unknown key (not shown: the entry is secret); known "
                                         f"keys: {', '.join(allowed)}",
                                         entry=_shorten(entry, 2 * _SHOWN), line=line or self.lines.get(entry))
                raise self.fail(where, f"unknown key {_render(key)}{hint}")
        return value

    def cluster(self, data: Any) -> Cluster:
        if data is None:
            raise self.fail("", "the file is empty; it needs at least a `hosts:` list")
        top = self.mapping(data, "", TOP_KEYS)
        defaults = self.mapping(top.get("defaults"), "defaults", HOST_KEYS)
        raw_hosts = top.get("hosts")
        if raw_hosts is None:
            raise self.fail("hosts", "is missing: list at least one host")
        if not isinstance(raw_hosts, list):
            raise self.fail("hosts", f"must be a list of host names or mappings, got {_describe(raw_hosts)}")
        if not raw_hosts:
            raise self.fail("hosts", "is empty: list at least one host")
        hosts = tuple(self.host(raw, f"hosts[{i}]", defaults) for i, raw in enumerate(raw_hosts))
        seen: dict[str, int] = {}
        for i, host in enumerate(hosts):
            if host.name in seen:
                raise self.fail(f"hosts[{i}]", f"host {_render(host.name)} is listed twice "
                                f"(also hosts[{seen[host.name]}])")
            seen[host.name] = i
        policy = top.get("host_key_policy", "strict")
        if policy not in HOST_KEY_POLICIES:
            choices = ", ".join(HOST_KEY_POLICIES)
            raise self.fail("host_key_policy", f"must be one of {choices}, got {_describe(policy)}")
        ssh_config = top.get("ssh_config")
        if ssh_config is not None:
            ssh_config = self.text(ssh_config, "ssh_config")
        return Cluster(
            source=self.source,
            hosts=hosts,
            rendezvous=self.rendezvous(top.get("rendezvous"), hosts),
            job=self.job(top["job"]) if top.get("job") is not None else None,
            ssh_config=ssh_config,
            host_key_policy=policy,
            sync=self.sync(top.get("sync")),
            retries=self.count(top.get("retries", 0), "retries"),
            lines=self.lines,
        )

    def host(self, raw: Any, entry: str, defaults: dict[str, Any]) -> Host:
        if isinstance(raw, str):
            raw = {"name": raw}
        elif not isinstance(raw, dict):
            raise self.fail(entry, f"must be a host name or a mapping with `name:`, got {_describe(raw)}")
        fields = self.mapping(raw, entry, ("name", "addr", *HOST_KEYS))
        if "name" not in fields:
            raise self.fail(entry, "has no `name:` (the ssh alias or address of the node)")
        name = self.host_name(fields["name"], f"{entry}.name")
        merged = {**DEFAULTS, **defaults, **fields}

        def get(key: str, check: Callable[[Any, str], Any]) -> Any:
            where = f"{entry}.{key}" if key in fields else f"defaults.{key}"
            value = merged.get(key)
            if value is None and key not in DEFAULTS:  # null leaves user, port, key to ssh config
                return None
            if value is None and key == "workdir":
                raise self.fail(where, 'must be a directory, got nothing (a bare ~ is null in YAML: write "~")')
            return check(value, where)

        base = self.env(defaults.get("env"), "defaults.env")
        secrets = frozenset(name for name, var in base.items() if var.secret)
        own = self.env(fields.get("env"), f"{entry}.env", secrets)
        # A host's override of a secret default stays secret: its errors, its dry-run line and its command.json.
        env = {**base, **{name: replace(var, secret=True) if name in secrets else var for name, var in own.items()}}
        return Host(
            name=name,
            addr=self.host_name(fields["addr"], f"{entry}.addr") if fields.get("addr") is not None else name,
            python=get("python", self.text),
            workdir=get("workdir", self.text),
            nproc_per_node=get("nproc_per_node", self.nproc),
            user=get("user", self.text),
            port=get("port", self.port),
            identity_file=get("identity_file", self.text),
            env=tuple(env.values()),
            **self.node_fields(entry, fields, defaults, env),
        )

    def rendezvous(self, raw: Any, hosts: tuple[Host, ...]) -> Rendezvous:
        fields = self.mapping(raw, "rendezvous", RENDEZVOUS_KEYS)
        addr = fields.get("master_addr")
        port = fields.get("master_port")
        first = hosts[0]
        other = next((h for h in hosts[1:] if addr in (h.name, h.addr) and addr not in (first.name, first.addr)), None)
        if other is not None:
            # torchrun's static rendezvous store listens on node rank 0; every other node would wait for it at
            # master_addr, where nothing listens, until a timeout.
            raise self.fail("rendezvous.master_addr", f"is {_render(addr)}, a node that is not the first host: "
                            f"torchrun's store runs on node rank 0 ({first.name}); list {other.name} first, "
                            "or drop master_addr")
        return Rendezvous(
            master_addr=first.addr if addr is None else self.host_name(addr, "rendezvous.master_addr"),
            master_port=DEFAULT_MASTER_PORT if port is None else self.port(port, "rendezvous.master_port"),
            master_addr_explicit=addr is not None,
            elastic=self.elastic(fields, len(hosts)),
        )

    def job(self, raw: Any) -> Job:
        fields = self.mapping(raw, "job", JOB_KEYS)
        if fields.get("script") is None:
            raise self.fail("job", "has no `script:` (the training script, relative to workdir)")
        args = [] if fields.get("args") is None else fields["args"]
        if not isinstance(args, list):
            raise self.fail("job.args", f"must be a list of words, got {_describe(args)}")
        words = tuple(self.word(a, f"job.args[{i}]") for i, a in enumerate(args))
        return Job(script=self.text(fields["script"], "job.script"), args=words,
                   resume_args=self.resume_args(fields.get("resume_args")))

    def env(self, raw: Any, entry: str, secret: frozenset[str] = frozenset()) -> dict[str, EnvVar]:
        """`NAME: value` entries; errors never show the values of the names in `secret`."""
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self.fail(entry, f"must be a mapping of NAME: value, got {_describe(raw)}")
        out: dict[str, EnvVar] = {}
        for name, value in raw.items():
            where = f"{entry}.{name}"
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise self.fail(where, f"{_render(name)} is not a valid environment variable name "
                                "(letters, digits and _, not starting with a digit)")
            reserved = reserved_reason(name)
            if reserved is not None:
                raise self.fail(where, reserved)
            if isinstance(value, dict):
                out[name] = self.env_spec(name, value, where, name in secret)
            else:
                out[name] = EnvVar(name, value=self.word(value, where, secret=name in secret))
        return out

    def env_spec(self, name: str, raw: dict[Any, Any], where: str, hidden: bool) -> EnvVar:
        """The `{value: ...}` / `{from_env: ...}` form; once it says `secret: true`, no error shows its values."""
        spec = self.mapping(raw, where, ENV_KEYS, secret=hidden)
        if ("value" in spec) == ("from_env" in spec):
            raise self.fail(where, "needs exactly one of `value:` or `from_env:`")
        secret = self.secret_flag(spec.get("secret", False), f"{where}.secret")
        hidden = hidden or secret
        from_env = spec.get("from_env")
        if "from_env" in spec and (not isinstance(from_env, str) or not _ENV_NAME.match(from_env)):
            # it may be the secret itself, pasted where its variable's name belongs
            raise self.fail(f"{where}.from_env",
                            f"must be an environment variable name, got {self.show(from_env, hidden)}")
        literal = self.word(spec["value"], f"{where}.value", secret=hidden) if "value" in spec else None
        return EnvVar(name, value=literal, from_env=from_env, secret=secret)

    def show(self, value: Any, secret: bool) -> str:
        """The value for a message, or only its type when it belongs to a secret entry."""
        if secret and value is not None:
            return f"a value of type {type(value).__name__} (not shown: the entry is secret)"
        return _describe(value)

    def text(self, value: Any, entry: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(entry, f"must be a non-empty string, got {_describe(value)}")
        if "\0" in value or "\n" in value:
            raise self.fail(entry, "must not contain a newline or NUL character")
        return value

    def word(self, value: Any, entry: str, secret: bool = False) -> str:
        """A job argument or env value: the text as written, for a plain scalar; a string or a number otherwise."""
        written = self.written.get(entry)
        if value is None:
            raise self.fail(entry, "must be a string or a number, got nothing; write '' for an empty string")
        # true/false are booleans in every YAML version, and almost always a mistake here; yes/no/on/off only in 1.1
        if written is not None and not (isinstance(value, bool) and written.lower() in ("true", "false")):
            return written  # `010`, `1:30`, `1.10`, `yes`: as typed, not as YAML 1.1 reads them (8, 90, 1.1, True)
        if isinstance(value, bool):
            raise self.fail(entry, f"must be a string or a number, got {self.show(value, secret)}; "
                            "quote it if you mean the word")
        # Numbers are fine as arguments (`--epochs: 3`); lists and mappings are almost always a mistake.
        if not isinstance(value, str | int | float):
            raise self.fail(entry, f"must be a string or a number, got {self.show(value, secret)}")
        if isinstance(value, str) and "\0" in value:
            raise self.fail(entry, "must not contain a NUL character")
        return str(value)

    def host_name(self, value: Any, entry: str) -> str:
        if not isinstance(value, str) or not _HOST_NAME.match(value):
            raise self.fail(entry, f"must be a host name, ssh alias or IP address, got {_describe(value)}")
        return value

    def port(self, value: Any, entry: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise self.fail(entry, f"must be a port number from 1 to 65535, got {_describe(value)}")
        return value

    def nproc(self, value: Any, entry: str) -> int | Literal["auto"]:
        if value == "auto":
            return "auto"
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(entry, f'must be a positive integer or "auto", got {_describe(value)}')
        if value > MAX_NPROC_PER_NODE:
            raise self.fail(entry, f"must be at most {MAX_NPROC_PER_NODE} (worker processes on one node), "
                            f"got {_describe(value)}")
        return value
