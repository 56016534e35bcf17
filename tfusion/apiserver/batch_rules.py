"""The batch/v1 rules that go beyond a field's own type: a CronJob's schedule and time zone, and the
Indexed Job fields (per-index retries, success policy, the limits on completions and parallelism).

Why it exists: kube-apiserver refuses these with a 422 naming the field, the value and what is
allowed; a manifest kube refuses must be refused here too, or it would be accepted on one box and
then fail on a real cluster. apps.py calls in here from its CronJob and Job validation; the
CronJob controller reads schedules and zones through the same tfusion.api.cron, so what is
accepted here is what it runs.
"""

from __future__ import annotations

from typing import Any

from tfusion.api import cron
from tfusion.apiserver.validation import Cause, invalid_value, required

#: kube's caps for Indexed Jobs: they bound the length of completedIndexes and failedIndexes
MAX_INDEXED_PARALLELISM = 100_000
MAX_FAILED_INDEXES = 100_000
#: above this many completions, per-index retries need tighter limits
COMPLETIONS_SOFT_LIMIT = 100_000
HIGH_COMPLETIONS_PARALLELISM = 10_000
HIGH_COMPLETIONS_FAILED_INDEXES = 10_000
MAX_SUCCESS_RULES = 20
MAX_SUCCEEDED_INDEXES_TEXT = 64 * 1024


# ------------------------------------------------------------------------------------ CronJob
def schedule_causes(spec: dict[str, Any], old_spec: dict[str, Any] | None) -> list[Cause]:
    """spec.schedule and spec.timeZone. A `CRON_TZ=`/`TZ=` prefix is refused in a new schedule
    (timeZone replaces it); a CronJob that already had one may keep it, without a timeZone."""
    schedule, named = spec.get("schedule"), spec.get("timeZone")
    causes = [] if named is None else _zone_causes(named)
    if not isinstance(schedule, str) or not schedule.strip():
        return [*causes, required("spec.schedule")]
    old_schedule = (old_spec or {}).get("schedule")
    if cron.names_zone(schedule):
        if not (isinstance(old_schedule, str) and cron.names_zone(old_schedule)):
            return [*causes, invalid_value("spec.schedule", schedule,
                                           "cannot use TZ or CRON_TZ in schedule, use timeZone field instead")]
        if named is not None:
            causes.append(invalid_value("spec.schedule", schedule,
                                        "cannot use both timeZone field and TZ or CRON_TZ in schedule"))
    prefix_zone, text = cron.split_zone(schedule)
    try:
        cron.zone(prefix_zone)
        cron.parse(text)
    except cron.CronError as exc:
        causes.append(invalid_value("spec.schedule", schedule, str(exc)))
    return causes


def _zone_causes(named: Any) -> list[Cause]:
    if not isinstance(named, str):
        return [invalid_value("spec.timeZone", named, "must be a string naming an IANA time zone")]
    try:
        cron.zone(named)
    except cron.ZoneError as exc:
        return [invalid_value("spec.timeZone", named, str(exc))]
    return []


# ------------------------------------------------------------------------------------ Indexed Jobs
def job_causes(spec: dict[str, Any], old_spec: dict[str, Any] | None) -> list[Cause]:
    """The Indexed Job limits, backoffLimitPerIndex / maxFailedIndexes, successPolicy, and which of
    them an update may change."""
    indexed = spec.get("completionMode") == "Indexed"
    causes = _indexed_limits(spec) if indexed else []
    causes += _per_index_causes(spec, indexed)
    policy = spec.get("successPolicy")
    if policy is not None:
        if not indexed:
            causes.append(invalid_value("spec.successPolicy", policy, "requires indexed completion mode"))
        else:
            causes += _success_policy_causes(policy, _int(spec.get("completions")))
    return causes + (_update_causes(spec, old_spec) if old_spec is not None else [])


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _indexed_limits(spec: dict[str, Any]) -> list[Cause]:
    completions, parallelism = _int(spec.get("completions")), _int(spec.get("parallelism"))
    most_failed, per_index = _int(spec.get("maxFailedIndexes")), spec.get("backoffLimitPerIndex")
    causes: list[Cause] = []
    if parallelism is not None and parallelism > MAX_INDEXED_PARALLELISM:
        causes.append(invalid_value("spec.parallelism", parallelism,
                                    f"must be less than or equal to {MAX_INDEXED_PARALLELISM} when completion "
                                    "mode is Indexed"))
    if completions is not None and most_failed is not None and most_failed > completions:
        causes.append(invalid_value("spec.maxFailedIndexes", most_failed, "must be less than or equal to completions"))
    if most_failed is not None and most_failed > MAX_FAILED_INDEXES:
        causes.append(invalid_value("spec.maxFailedIndexes", most_failed,
                                    f"must be less than or equal to {MAX_FAILED_INDEXES}"))
    if completions is not None and completions > COMPLETIONS_SOFT_LIMIT and per_index is not None:
        causes += _high_completions_causes(parallelism, most_failed)
    return causes


def _high_completions_causes(parallelism: int | None, most_failed: int | None) -> list[Cause]:
    """Past COMPLETIONS_SOFT_LIMIT completions, per-index retries need a maxFailedIndexes and lower caps."""
    why = f"when completions are above {COMPLETIONS_SOFT_LIMIT} and used with backoff limit per index"
    causes: list[Cause] = []
    if most_failed is None:
        causes.append(required("spec.maxFailedIndexes", f"must be specified when completions is above "
                                                        f"{COMPLETIONS_SOFT_LIMIT}"))
    elif most_failed > HIGH_COMPLETIONS_FAILED_INDEXES:
        causes.append(invalid_value("spec.maxFailedIndexes", most_failed,
                                    f"must be less than or equal to {HIGH_COMPLETIONS_FAILED_INDEXES} {why}"))
    if parallelism is not None and parallelism > HIGH_COMPLETIONS_PARALLELISM:
        causes.append(invalid_value("spec.parallelism", parallelism,
                                    f"must be less than or equal to {HIGH_COMPLETIONS_PARALLELISM} {why}"))
    return causes


def _per_index_causes(spec: dict[str, Any], indexed: bool) -> list[Cause]:
    causes: list[Cause] = []
    per_index, most_failed = spec.get("backoffLimitPerIndex"), spec.get("maxFailedIndexes")
    for key, value in (("backoffLimitPerIndex", per_index), ("maxFailedIndexes", most_failed)):
        if value is not None and (_int(value) is None or value < 0):
            causes.append(invalid_value(f"spec.{key}", value, "must be greater than or equal to 0"))
    if per_index is not None and not indexed:
        causes.append(invalid_value("spec.backoffLimitPerIndex", per_index, "requires indexed completion mode"))
    if most_failed is not None and per_index is None:
        causes.append(required("spec.backoffLimitPerIndex", "when maxFailedIndexes is specified"))
    return causes


def _success_policy_causes(policy: Any, completions: int | None) -> list[Cause]:
    rules = policy.get("rules") if isinstance(policy, dict) else None
    if not isinstance(rules, list) or not rules:
        return [required("spec.successPolicy.rules",
                         "at least one rules must be specified when the successPolicy is specified")]
    causes: list[Cause] = []
    if len(rules) > MAX_SUCCESS_RULES:
        causes.append(("spec.successPolicy.rules", "FieldValueTooMany",
                       f"Too many: {len(rules)}: must have at most {MAX_SUCCESS_RULES} items"))
    for position, rule in enumerate(rules):
        causes += _rule_causes(rule if isinstance(rule, dict) else {}, f"spec.successPolicy.rules[{position}]",
                               completions or 0)
    return causes


def _rule_causes(rule: dict[str, Any], where: str, completions: int) -> list[Cause]:
    named, count = rule.get("succeededIndexes"), rule.get("succeededCount")
    if named is None and count is None:
        return [required(where, "at least one of succeededCount or succeededIndexes must be specified")]
    causes: list[Cause] = []
    listed = 0
    if named is not None:
        text = str(named)
        if len(text) > MAX_SUCCEEDED_INDEXES_TEXT:
            causes.append((f"{where}.succeededIndexes", "FieldValueTooLong",
                           f"Too long: may not be more than {MAX_SUCCEEDED_INDEXES_TEXT} bytes"))
        try:
            listed = count_indexes(text, completions)
        except ValueError as exc:
            causes.append(invalid_value(f"{where}.succeededIndexes", text, f"error parsing succeededIndexes: {exc}"))
    if count is not None:
        causes += _rule_count_causes(count, f"{where}.succeededCount", completions,
                                     listed if named is not None else None)
    return causes


def _rule_count_causes(count: Any, where: str, completions: int, listed: int | None) -> list[Cause]:
    if _int(count) is None or count < 0:
        return [invalid_value(where, count, "must be greater than or equal to 0")]
    if count > completions:
        return [invalid_value(where, count,
                              f"must be less than or equal to {completions} (the number of specified completions)")]
    if listed is not None and count > listed:
        return [invalid_value(where, count, f"must be less than or equal to {listed} (the number of indexes in the "
                                            "specified succeededIndexes field)")]
    return []


def count_indexes(text: str, completions: int) -> int:
    """How many indexes an interval list ("1,3-5") names; ValueError says what is wrong with it:
    a part that is not a number or range, an index outside 0..completions-1, or intervals out of order."""
    total, previous = 0, -1
    for part in text.split(","):
        low_text, dash, high_text = part.partition("-")
        if not low_text.isdigit() or (dash and not high_text.isdigit()):
            raise ValueError(f"{part!r} is not an index or an interval such as 3-5")
        low, high = int(low_text), int(high_text) if dash else int(low_text)
        if high >= completions:
            raise ValueError(f"too large index: {high} (completions is {completions})")
        if low > high:
            raise ValueError(f"interval {part!r} has its first index after its last")
        if low <= previous:
            raise ValueError(f"non-increasing order, previous: {previous}, current: {low}")
        total, previous = total + high - low + 1, high
    return total


def _update_causes(spec: dict[str, Any], old_spec: dict[str, Any]) -> list[Cause]:
    """completionMode and successPolicy never change; completions only in an Indexed Job whose
    completions equal its parallelism before and after (scaling it)."""
    causes = [invalid_value(f"spec.{key}", spec.get(key) if key == "completionMode" else "", "field is immutable")
              for key in ("completionMode", "successPolicy") if spec.get(key) != old_spec.get(key)]
    completions = spec.get("completions")
    if completions != old_spec.get("completions"):
        scaled = (spec.get("completionMode") == "Indexed" and completions == spec.get("parallelism")
                  and old_spec.get("completions") == old_spec.get("parallelism"))
        if not scaled:
            causes.append(invalid_value("spec.completions", completions, "field is immutable"))
    return causes
