"""The CronJob schedule rules for a CronJob stored with a CRON_TZ= prefix (which no write can create
any more, so the HTTP tests cannot reach it): it may keep the prefix, but not add a timeZone too."""

from __future__ import annotations

from tfusion.apiserver.batch_rules import count_indexes, schedule_causes

OLD = {"schedule": "CRON_TZ=Europe/Paris 0 6 * * *"}


def fields(causes: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    return [(field, message) for field, _, message in causes]


def test_a_stored_prefix_may_stay() -> None:
    assert schedule_causes({"schedule": "CRON_TZ=Europe/Paris 0 7 * * *"}, OLD) == []


def test_a_stored_prefix_and_a_time_zone_together_are_refused() -> None:
    causes = fields(schedule_causes({"schedule": OLD["schedule"], "timeZone": "UTC"}, OLD))
    assert causes == [("spec.schedule", 'Invalid value: "CRON_TZ=Europe/Paris 0 6 * * *": cannot use both '
                                        "timeZone field and TZ or CRON_TZ in schedule")]


def test_a_stored_prefix_naming_an_unknown_zone_is_refused() -> None:
    causes = fields(schedule_causes({"schedule": "CRON_TZ=Mars/Base 0 6 * * *"}, OLD))
    assert len(causes) == 1 and "unknown time zone Mars/Base" in causes[0][1]


def test_a_new_prefix_is_refused_even_on_update_of_a_cronjob_without_one() -> None:
    causes = fields(schedule_causes({"schedule": "TZ=UTC 0 6 * * *"}, {"schedule": "0 6 * * *"}))
    assert causes[0][0] == "spec.schedule" and "use timeZone field instead" in causes[0][1]


def test_index_lists_are_counted() -> None:
    assert count_indexes("0,2-4,7", 8) == 5
