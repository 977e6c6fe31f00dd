"""The recipe's ``rllm:`` block, read in one place: every key, what it takes, its default and its check.

verl reads its own keys; what rllm adds to a verl recipe lives under ``rllm:`` (``strands_base.yaml``
sets every key; docs/training-verl.md, "The rllm block", lists them). ``read_settings`` reads the whole
block into frozen dataclasses and refuses, with a ``ConfigurationError`` naming the dotted key, the
value given and what the key takes, a value of the wrong type or range and a key nothing reads (a
typo must not pass silently). The launcher reads it when it prepares the config, before Ray starts;
the guards, the agent-loop manager and every agent loop read the config they are handed through it
again. ``loop_settings`` resolves the agent loop's part in the loop's own process: it imports the
budget and the exception classes the block names and reads verl's ``multi_turn`` keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rllm.errors import ConfigurationError

if TYPE_CHECKING:
    from rllm.integrations.strands import Budget

BLOCK_KEY = "rllm"
"""The recipe's block of rllm's own keys."""
GUARDS_KEY = f"{BLOCK_KEY}.guards"
"""Where the recipe holds the guard settings (the fields of ``GuardSettings``)."""
SETTINGS_KEY = f"{BLOCK_KEY}.agent_loop"
"""Where the recipe holds the agent loop's settings (the fields of ``AgentLoopBlock``)."""
RECORDS_KEY = f"{BLOCK_KEY}.rollout_records"
"""Where the recipe holds which steps' rollouts are kept in the run directory (``RolloutRecordSettings``)."""
REWARD_KEY = f"{BLOCK_KEY}.reward_fn"
"""The recipe's reward: ``module:function`` scoring ``(task, final_answer)`` as evaluation does."""
MULTI_TURN_KEY = "actor_rollout_ref.rollout.multi_turn"
"""verl's own multi-turn keys, which the agent loop honours where it can (``loop_settings``)."""


# ---------------------------------------------------------------------------------------------- kinds
def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Kind:
    """What a key takes: what the refusal says, the check, and wrong values the tests feed it.

    Attributes:
        expected: What the key takes, as the refusal says it ("a number from 0 to 1, or null (...)").
        problem: ``problem(value)``: ``None`` when ``value`` is taken, else what is wrong ("" when
            ``expected`` says it all).
        convert: The value as the settings hold it (a list as a tuple, a null flag as ``False``).
        wrong_types: Values of another type, each refused.
        wrong_values: Values of the right type that the key refuses (none for a flag).
    """

    expected: str
    problem: Callable[[Any], str | None]
    wrong_types: tuple[Any, ...]
    wrong_values: tuple[Any, ...] = ()
    convert: Callable[[Any], Any] = _same

    def read(self, key: str, value: Any) -> Any:
        """``value`` as the settings hold it; ``ConfigurationError`` naming ``key``, ``value`` and the fix."""
        problem = self.problem(value)
        if problem is not None:
            raise ConfigurationError(f"{key}={value!r}: {problem + '; ' if problem else ''}expected {self.expected}")
        return self.convert(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(*, low: float, high: float | None = None, above: bool = False, whole: bool = False,
            null: str | None = None) -> Kind:
    """A number from ``low`` (excluded with ``above``) to ``high``; ``whole``: an integer; ``null``: what null means."""
    if high is not None:
        span = f"above {low:g} up to {high:g}" if above else f"from {low:g} to {high:g}"
    else:
        span = f"above {low:g}" if above else f"of at least {low:g}"
    expected = f"{'a whole number' if whole else 'a number'} {span}" + (f", or null ({null})" if null else "")

    def problem(value: Any) -> str | None:
        if value is None and null:
            return None
        if not _is_number(value) or (whole and not isinstance(value, int)):
            return ""
        if math.isnan(value) or value < low or (above and value == low) or (high is not None and value > high):
            return ""
        return None

    def convert(value: Any) -> Any:
        return value if whole or value is None else float(value)

    return Kind(expected, problem, wrong_types=("ten", True) + ((1.5,) if whole else ()),
                wrong_values=(low if above else low - 1,) + ((high + 0.5,) if high is not None else ()),
                convert=convert)


def _flag(null: str) -> Kind:
    """``true`` or ``false``; null reads as false (``null`` says what that means)."""
    return Kind(f"true or false (null: {null})",
                lambda value: None if value is None or isinstance(value, bool) else "",
                wrong_types=("yes", 1), convert=lambda value: bool(value))


_IDENTIFIER = r"[A-Za-z_]\w*"
_DOTTED = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}|{_IDENTIFIER}(\.{_IDENTIFIER})+"
                     rf"|.+\.pkl:{_IDENTIFIER}")
"""``module:name``, ``module.name`` or ``file.pkl:name`` (``rllm.training.verl._dotted.import_object``)."""


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and _DOTTED.fullmatch(value) is not None


def _path(what: str, null: str) -> Kind:
    """A dotted path to ``what``; null (or empty) for none."""
    return Kind(f"a dotted path to {what} like 'my_module:my_name', or null ({null})",
                lambda value: None if value in (None, "") or _is_path(value) else
                ("" if isinstance(value, str) else "not text"),
                wrong_types=(3, ["my_module:my_name"]), wrong_values=("my_name", "my module:my name"),
                convert=lambda value: value or None)


def _paths(what: str) -> Kind:
    """A list of dotted paths; null for none."""
    def problem(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, list | tuple):
            return "not a list"
        wrong = [item for item in value if not _is_path(item)]
        return f"{wrong[0]!r} is not a dotted path" if wrong else None

    return Kind(f"a list of dotted paths to {what} like ['httpx:TransportError'], or null (none)", problem,
                wrong_types=("httpx:TransportError", 3), wrong_values=(["TransportError"], [3]),
                convert=lambda value: tuple(value or ()))


def _text(null: str) -> Kind:
    """Text that is not blank, or null."""
    return Kind(f"text that is not blank, or null ({null})",
                lambda value: None if value is None or (isinstance(value, str) and value.strip()) else "",
                wrong_types=(3, ["text"]), wrong_values=("", "  "))


def _keywords() -> Kind:
    """A mapping of keyword arguments (names to any values); null for none."""
    def problem(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            return ""
        names = [name for name in value if not (isinstance(name, str) and name.isidentifier())]
        return f"{names[0]!r} is not a keyword name" if names else None

    return Kind("a mapping of keyword names to values, or null (none)", problem,
                wrong_types=(["retrieval_url"], "retrieval_url=x"), wrong_values=({1: "x"}, {"max chars": 3}),
                convert=lambda value: dict(value or {}))


_BUDGET_MINIMUM = {"max_model_turns": 1, "max_tool_iterations": 0, "max_tool_calls": 0}
"""The ``Budget`` fields a mapping may give, each a whole number of at least this (or null: unlimited)."""


def _budget_problem(value: Any) -> str | None:
    if value is None or _is_path(value):
        return None
    if not isinstance(value, Mapping):
        return "" if not isinstance(value, str) else "not a dotted path"
    unknown = sorted(set(value) - set(_BUDGET_MINIMUM), key=str)
    if unknown:
        return f"unknown keys {unknown}"
    for name, limit in value.items():
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or
                                  limit < _BUDGET_MINIMUM[name]):
            return f"{name}={limit!r} is not a whole number of at least {_BUDGET_MINIMUM[name]} (or null)"
    return None


_BUDGET = Kind("a dotted path to a Budget like 'rllm.agents.search:DEFAULT_SEARCH_BUDGET', a mapping of its "
               f"fields ({', '.join(_BUDGET_MINIMUM)}: whole numbers or null), or null (Budget()'s defaults)",
               _budget_problem, wrong_types=(3, [4]), wrong_values=({"max_turns": 4}, {"max_model_turns": 0}),
               convert=lambda value: dict(value) if isinstance(value, Mapping) else value)

_KIND = "rllm_kind"
_SECTION = "rllm_section"


def _key(default: Any, kind: Kind) -> Any:
    """A dataclass field for one key: its default and its kind."""
    return field(default=default, metadata={_KIND: kind})


def _share(null: str, *, above: bool = False) -> Kind:
    """A share of a step's rollouts or calls: a number from 0 (excluded with ``above``) to 1, or null."""
    return _number(low=0.0, high=1.0, above=above, null=null)


_OFF = "the guard off"


# ------------------------------------------------------------------------------------------- the block
@dataclass(frozen=True)
class GuardSettings:
    """``rllm.guards``: thresholds of the training guards (``rllm.training.verl.trainer.guards``); null turns one off.

    Attributes:
        max_logprob_gap: Largest mean |rollout - actor| log-prob over sampled tokens (0.1).
        logprob_audit_rollouts: With verl's bypass mode (no recomputed log-probs), the rollouts of each
            step whose log-probs the actor recomputes for the gap (rounded up to the data-parallel size; 16).
        min_rollouts_per_group: Fewest rollouts a group (verl ``uid``) may have (2).
        max_truncated_share: Largest share of responses cut at ``response_length`` (0.5).
        max_steps_without_signal: Steps in a row with a constant reward in every group before stopping (3).
        max_context_overflow_share: Largest share of a step's rollouts that ended ``context_overflow``
            (a history longer than the prompt length even after the conversation manager trimmed it; 0.5).
        max_steps_without_tool_calls: Steps in a row in which agents with tools called none before
            stopping (the tool parser, ``multi_turn.format``, never matches what the model writes; 3).
        max_malformed_tool_call_share: The share of a step's tool calls malformed (at least this) that
            counts toward the malformed-call stop (1.0: every one of them); a warning at the first such step.
        max_steps_with_malformed_tool_calls: Steps in a row at that share before stopping (3): one step's
            malformed calls are not evidence (a random policy writes a few by chance).
        min_tool_calls_for_malformed_stop: Fewest tool calls a step needs to count toward the malformed-call
            stop (10): a random or barely trained policy writes a handful of malformed calls by chance (a random
            model's smoke run: 7 at step 1), a parser that cannot read a model using its tools fails dozens a step.
        warn_on_tool_collapse: Warn when tool calls per episode fall to zero after being above it (true).
        served_weights: After every weight sync, compare what the rollout servers serve with the actor's
            parameters (``rllm.training.verl.weights.served_weights``; true).
    """

    max_logprob_gap: float | None = _key(0.1, _number(low=0, null=_OFF))
    logprob_audit_rollouts: int = _key(16, _number(low=1, whole=True))
    min_rollouts_per_group: int | None = _key(2, _number(low=1, whole=True, null=_OFF))
    max_truncated_share: float | None = _key(0.5, _share(_OFF))
    max_steps_without_signal: int | None = _key(3, _number(low=1, whole=True, null=_OFF))
    max_context_overflow_share: float | None = _key(0.5, _share(_OFF))
    max_steps_without_tool_calls: int | None = _key(3, _number(low=1, whole=True, null=_OFF))
    max_malformed_tool_call_share: float | None = _key(1.0, _share(_OFF, above=True))
    max_steps_with_malformed_tool_calls: int = _key(3, _number(low=1, whole=True))
    min_tool_calls_for_malformed_stop: int = _key(10, _number(low=1, whole=True))
    warn_on_tool_collapse: bool = _key(True, _flag("no warning"))
    served_weights: bool = _key(True, _flag("no check"))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> GuardSettings:
        """Settings from the recipe's ``rllm.guards`` block; ``ConfigurationError`` naming a key it refuses."""
        settings: GuardSettings = _read_section(cls, GUARDS_KEY, values, cls())
        return settings


@dataclass(frozen=True)
class RolloutRecordSettings:
    """``rllm.rollout_records``: the rollouts a run keeps, ``rollouts/step_NNNNNN.jsonl`` in its directory.

    Each line is one rollout as trained: task, conversation, reward, advantage, ending and per sample its
    tokens with loss mask and log-probs (``rllm.training.verl.trainer.rollout_records``; ``python -m
    rllm.viewer RUN_DIR`` shows them).

    Attributes:
        every_n_steps: Keep the rollouts of every Nth step (1: every step; null: none, and the agent loop
            sends no conversation to the trainer).
        max_per_step: Most rollouts kept per step, the first in the batch's order (null: all of them).
    """

    every_n_steps: int | None = _key(1, _number(low=1, whole=True, null="no records"))
    max_per_step: int | None = _key(None, _number(low=1, whole=True, null="every rollout of the step"))

    def keeps(self, step: int) -> bool:
        """Whether step ``step``'s rollouts are kept."""
        return self.every_n_steps is not None and step % self.every_n_steps == 0


@dataclass(frozen=True)
class AgentLoopBlock:
    """``rllm.agent_loop`` as the recipe writes it, checked (``loop_settings`` resolves what it names).

    Attributes:
        tool_factory: ``module:function`` returning the agent's Strands tools; the loop builds a
            ``StrandsAgent`` with them, the system prompt and the budget. One of it and ``agent_factory`` (null).
        agent_factory: ``module:function`` taking ``(model, task)`` and returning the user's Strands
            ``Agent``, ``Swarm`` or ``Graph`` (its own class, hooks, tools, conversation manager) built on
            ``model``, the rollout's ``RLLMModel`` (null). ``task`` is the user's task when the rows were
            written from task files (``data.train_files`` of tasks: the dict itself), else verl's dataset
            row as the worker passes it (``raw_prompt``, ``extra_info``, ``reward_model``, ...). The loop
            attaches a ``RolloutRecorder`` (with the budget and ``infra_exceptions``) and runs it on the
            row's prompt without its system message, which the factory sets itself.
        tool_kwargs: Keyword arguments for ``tool_factory`` (``retrieval_url``, ...; none).
        system_prompt: The system message of the agent built from ``tool_factory`` when the rows carry none
            (null: the rows' own; a row without one is then refused).
        budget: The episode ``Budget``: a dotted path to a ``Budget``, or a mapping of its fields (null:
            ``Budget()``'s defaults); its model calls are replaced by ``multi_turn.max_assistant_turns`` when
            that is set.
        timeout_s: Seconds after which a running rollout is an infrastructure failure (a hung tool or server),
            excluded from the update (null: no limit; the recipes set 600).
        infra_exceptions: Further exception classes (dotted paths) that, raised by a tool, mark the rollout an
            infrastructure failure (``rllm.errors.InfrastructureError`` always does; none). Tools mark their own
            backend failures by raising ``rllm.errors.ToolBackendError`` (as ``local_search`` does); name a
            third-party exception (``httpx.TransportError``) only when it can never be the policy's doing.
        max_tokens_per_turn: Most tokens one model call may sample (Strands' model ``params`` ``max_tokens``;
            null: what is left of ``data.max_response_length``).
        own_client: The factory's agent may keep its own model client (Strands' ``OpenAIModel`` on
            ``rllm.tracing.policy_endpoint().async_client()``): the worker serves the policy to it over HTTP
            (``rllm.tracing.PolicyServer``, its address in ``RLLM_POLICY_*``), each call on the rollout's
            engine, and the rollout is read from the server's traces (``run_served_rollout``). An agent the
            factory builds on the model it is given runs on that model as without it (false).
        task_to_prompt: ``module:function`` taking a task dict and returning the user message, as
            ``AgentTrainer``'s ``workflow_args["task_to_prompt"]``: the launcher writes task files
            (``data.train_files``, ``data.val_files``) as rows with it (null: the task's ``question``,
            ``prompt`` or ``problem``). Rows given as verl rows already hold their prompt.
    """

    tool_factory: str | None = _key(None, _path("a function returning the agent's Strands tools", "none"))
    agent_factory: str | None = _key(None, _path("a function (model, task) returning a Strands agent", "none"))
    tool_kwargs: dict[str, Any] = field(default_factory=dict, metadata={_KIND: _keywords()})
    system_prompt: str | None = _key(None, _text("the rows' system message"))
    budget: str | dict[str, int | None] | None = _key(None, _BUDGET)
    timeout_s: float | None = _key(None, _number(low=0, above=True, null="no limit"))
    infra_exceptions: tuple[str, ...] = _key((), _paths("exception classes"))
    max_tokens_per_turn: int | None = _key(None, _number(low=1, whole=True, null="what is left of the response"))
    own_client: bool = _key(False, _flag("false"))
    task_to_prompt: str | None = _key(None, _path("a function (task) returning the user message",
                                                  "the task's question, prompt or problem"))


@dataclass(frozen=True)
class RllmSettings:
    """The recipe's whole ``rllm:`` block.

    Attributes:
        guards: ``rllm.guards`` (``GuardSettings``; null: every guard at its default).
        max_infra_failure_share: Stop training when more than this share of a step's (or a validation
            batch's) rollouts were dropped as infrastructure failures (0.5; null: never).
        reward_fn: ``module:function`` scoring ``(task, final_answer)`` as ``StrandsWorkflow`` does
            (null: a verl reward function the recipe names in ``reward.custom_reward_function`` scores instead).
        agent_loop: ``rllm.agent_loop`` (``AgentLoopBlock``); null where the recipe has none (an agent
            loop refuses to run without it).
        rollout_records: ``rllm.rollout_records`` (``RolloutRecordSettings``; null: every step's rollouts kept).
    """

    guards: GuardSettings = field(default_factory=GuardSettings, metadata={_SECTION: GuardSettings})
    max_infra_failure_share: float | None = _key(0.5, _share("never stop"))
    reward_fn: str | None = _key(None, _path("a function (task, final_answer) returning a reward",
                                                 "the recipe's own verl reward function"))
    agent_loop: AgentLoopBlock | None = field(default=None, metadata={_SECTION: AgentLoopBlock})
    rollout_records: RolloutRecordSettings = field(default_factory=RolloutRecordSettings,
                                                   metadata={_SECTION: RolloutRecordSettings})


SECTION_KIND = Kind("a mapping of its keys, or null (the defaults)",
                    lambda value: None if value is None or isinstance(value, Mapping) else "", wrong_types=("on", [1]))
"""What a section (``rllm``, ``rllm.guards``, ``rllm.agent_loop``) takes: a mapping, or null."""


def _default(spec: dataclasses.Field[Any]) -> Any:
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def _read_section(cls: type[Any], key: str, values: Any, default: Any) -> Any:
    """``cls`` read from the mapping ``values`` (``default`` for null); every key known and checked."""
    if values is None:
        return default
    fields = {spec.name: spec for spec in dataclasses.fields(cls)}
    if not isinstance(values, Mapping):
        raise ConfigurationError(f"{key}={values!r}: expected a mapping of {', '.join(fields)}, or null (the defaults)")
    unknown = sorted((name for name in values if name not in fields), key=str)
    if unknown:
        given = ", ".join(f"{key}.{name}={values[name]!r}" for name in unknown)
        close = [match for name in unknown for match in difflib.get_close_matches(str(name), fields, n=1)]
        hint = f" (did you mean {', '.join(f'{key}.{name}' for name in close)}?)" if close else ""
        raise ConfigurationError(f"unknown keys {[f'{key}.{name}' for name in unknown]} ({given}): nothing reads "
                                 f"them; {key} holds {', '.join(fields)}{hint}")
    read = {}
    for name, value in values.items():
        spec = fields[name]
        section = spec.metadata.get(_SECTION)
        read[name] = (_read_section(section, f"{key}.{name}", value, _default(spec)) if section is not None
                      else spec.metadata[_KIND].read(f"{key}.{name}", value))
    return cls(**read)


def _plain(block: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(block, DictConfig | ListConfig):
        return OmegaConf.to_container(block, resolve=True)
    return block


def _select(config: Any, key: str) -> Any:
    """The plain value at ``key`` of an OmegaConf config or a plain mapping (``None`` when absent)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(config, DictConfig):
        return _plain(OmegaConf.select(config, key, default=None))
    node = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return _plain(node)


def read_settings(config: Any) -> RllmSettings:
    """The whole ``rllm:`` block of a (composed) recipe; ``ConfigurationError`` naming the first key it refuses.

    A recipe without the block gets every default (and no ``agent_loop``).
    """
    settings: RllmSettings = _read_section(RllmSettings, BLOCK_KEY, _select(config, BLOCK_KEY), RllmSettings())
    return settings


@dataclass(frozen=True)
class Setting:
    """One key of the block, for its table and its tests.

    Attributes:
        key: The dotted key (``rllm.guards.max_logprob_gap``).
        kind: What it takes.
        default: Its value when the recipe leaves it out.
    """

    key: str
    kind: Kind
    default: Any


def _walk(cls: type[Any], prefix: str) -> list[Setting]:
    found = []
    for spec in dataclasses.fields(cls):
        key = f"{prefix}.{spec.name}"
        section = spec.metadata.get(_SECTION)
        if section is not None:
            found.append(Setting(key, SECTION_KIND, _default(spec)))
            found += _walk(section, key)
        else:
            found.append(Setting(key, spec.metadata[_KIND], _default(spec)))
    return found


SETTINGS: tuple[Setting, ...] = (Setting(BLOCK_KEY, SECTION_KIND, None), *_walk(RllmSettings, BLOCK_KEY))
"""Every key of the block, sections (``rllm.guards``) included, in the order the dataclasses declare them."""
AGENT_LOOP_KEYS = tuple(spec.name for spec in dataclasses.fields(AgentLoopBlock))
"""The keys of ``rllm.agent_loop``."""


# ---------------------------------------------------------------------------------- the agent loop's
_UNSUPPORTED_MULTI_TURN = {
    "max_user_turns": "limit tool rounds with the budget's max_tool_iterations (rllm.agent_loop.budget)",
    "max_parallel_calls": "the agent runs every call of a turn; limit calls with the budget's max_tool_calls",
    "max_tool_response_length": "tools bound their own output (local_search: rllm.agent_loop.tool_kwargs.max_chars)",
    "tool_response_truncate_side": "tools bound their own output (local_search: rllm.agent_loop.tool_kwargs.max_chars)",
    "use_inference_chat_template": "the loop trains on the exact tokens it sampled (token-in/token-out)",
    "tokenization_sanity_check_mode": "the loop checks the chat template when its engine is built (TemplateError)",
    "tool_config_path": "the loop runs the Strands tools of rllm.agent_loop.tool_factory",
    "function_tool_path": "the loop runs the Strands tools of rllm.agent_loop.tool_factory",
}
"""verl ``multi_turn`` keys that would shape a rollout and that this loop cannot honour: a value other
than verl's default is refused, with what to do instead. (``format`` and ``max_assistant_turns``
are honoured; ``enable`` and ``num_repeat_rollouts`` shape no rollout of this loop.)"""


@dataclass(frozen=True)
class LoopSettings:
    """What the loop runs: the checked ``rllm.agent_loop`` block and what only its process can resolve of it.

    The block's keys are read from ``block`` (``AgentLoopBlock`` says what each takes); this class holds
    only what resolving adds, so no key is written twice.

    Attributes:
        block: ``rllm.agent_loop`` as checked (``tool_factory``, ``agent_factory``, ``system_prompt``, ...).
        budget: ``block.budget`` resolved: the ``Budget`` it names or maps, with ``multi_turn.max_assistant_turns``.
        infra_exceptions: ``block.infra_exceptions`` resolved: the exception classes imported.
        tool_parser: How tool calls are parsed from sampled text: verl's ``multi_turn.format`` (``hermes``).
        reward_fn: The recipe's ``rllm.reward_fn`` (``RllmSettings.reward_fn``), which the loop scores with and
            hands verl the score (``AgentLoopOutput.reward_score``); ``None``: the recipe's own verl reward function.
    """

    block: AgentLoopBlock
    budget: Budget
    infra_exceptions: tuple[type[BaseException], ...]
    tool_parser: str = "hermes"
    reward_fn: str | None = None


def _import(key: str, path: str) -> Any:
    from rllm.training.verl._dotted import import_object

    try:
        return import_object(path)
    except ImportError as error:
        raise ConfigurationError(f"{key}={path}: {error}") from error


def _budget(value: str | dict[str, int | None] | None) -> Budget:
    from rllm.integrations.strands import Budget

    if value is None:
        return Budget()
    if isinstance(value, str):
        budget = _import(f"{SETTINGS_KEY}.budget", value)
        if not isinstance(budget, Budget):
            raise ConfigurationError(f"{SETTINGS_KEY}.budget={value}: a {type(budget).__name__}, not a Budget; "
                                     f"expected {_BUDGET.expected}")
        return budget
    return Budget(**value)


def _exception_class(path: str) -> type[BaseException]:
    found = _import(f"{SETTINGS_KEY}.infra_exceptions", path)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise ConfigurationError(f"{SETTINGS_KEY}.infra_exceptions: {path} is a {type(found).__name__}, not an "
                                 "exception class; expected dotted paths to exception classes")
    return found


def _multi_turn(config: Any) -> tuple[str, int | None]:
    """The ``multi_turn`` keys of verl the loop honours (``format``, ``max_assistant_turns``); the others refused."""
    from verl.workers.config import MultiTurnConfig

    from rllm.parser import get_tool_parser

    multi_turn = dict(_select(config, MULTI_TURN_KEY) or {})
    defaults = {spec.name: spec.default for spec in dataclasses.fields(MultiTurnConfig)}
    for key, instead in _UNSUPPORTED_MULTI_TURN.items():
        if key in multi_turn and multi_turn[key] != defaults.get(key):
            raise ConfigurationError(f"StrandsAgentLoop cannot honour {MULTI_TURN_KEY}.{key}={multi_turn[key]!r}; "
                                     f"leave it at verl's default ({defaults.get(key)!r}): {instead}")
    tool_parser = str(multi_turn.get("format") or "hermes")
    try:
        get_tool_parser(tool_parser)
    except ValueError as error:
        raise ConfigurationError(f"{MULTI_TURN_KEY}.format: {error}") from None
    turns = multi_turn.get("max_assistant_turns")
    if turns is not None and (not isinstance(turns, int) or isinstance(turns, bool) or turns < 1):
        raise ConfigurationError(f"{MULTI_TURN_KEY}.max_assistant_turns={turns!r}: expected a whole number of at "
                                 "least 1 (the model calls of a rollout), or null (the budget's)")
    return tool_parser, turns


def loop_settings(config: Any) -> LoopSettings:
    """The loop's settings from the (composed) trainer config; ``ConfigurationError`` naming what it refuses.

    Beyond ``read_settings``: a missing ``rllm.agent_loop`` block, neither or both of ``tool_factory``
    and ``agent_factory``, ``own_client`` without ``agent_factory``, a budget or exception class that
    does not import, an unknown ``multi_turn.format``, and a ``multi_turn`` key set to a value the
    loop cannot honour.
    """
    settings = read_settings(config)
    block = settings.agent_loop
    if block is None:
        raise ConfigurationError(f"StrandsAgentLoop reads its settings from the recipe's {SETTINGS_KEY} block "
                                 f"({', '.join(AGENT_LOOP_KEYS)}), which this config lacks")
    from rllm.integrations.strands.runner import check_agent_choice

    # system_prompt stays allowed beside agent_factory here: it is the rows' fallback system message.
    check_agent_choice(SETTINGS_KEY, agent_factory=block.agent_factory or None, tools=block.tool_factory or None,
                       own_client=block.own_client, tools_key="tool_factory")
    tool_parser, turns = _multi_turn(config)
    budget = _budget(block.budget)
    if turns is not None:
        budget = dataclasses.replace(budget, max_model_turns=turns)
    return LoopSettings(block=block, budget=budget, tool_parser=tool_parser, reward_fn=settings.reward_fn,
                        infra_exceptions=tuple(_exception_class(path) for path in block.infra_exceptions))
