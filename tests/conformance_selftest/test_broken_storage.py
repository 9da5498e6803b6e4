"""The volume and rollout-buffer laws catch real storage bugs: each broken store or buffer fails the laws it breaks,
with a message naming the bug, and only those; a correct store and buffer written independently of ours pass, and so
does IN_MEMORY (our `LocalVolumeStore` and `VolumeBuffer`).

Every case runs the packaged suite the way a fork does (`--pyargs rl.conformance.test_suite --rl-impl ...`).
"""

from __future__ import annotations

import re

import pytest
from suite_runner import run_suite

# slow: each case runs the volume state machine in process (too long for `unit`: docs/benchmarks.md); `nox -s slow`
# runs them in CI, and tests/test_volumes.py runs every volume law on our store in `unit`.
pytestmark = pytest.mark.slow

pytest_plugins = ("pytester",)

MACHINE = "test_volumes_random_histories_match_a_dict_model"
ISOLATION = "test_volumes_a_forks_writes_are_invisible_to_its_parent_and_siblings"
NEVER_CHANGES = "test_volumes_a_finalized_version_never_changes"
ONE_WRITER = "test_volumes_a_second_writer_of_a_name_is_refused"
LOST_WRITER = "test_volumes_a_writer_lost_before_finalize_publishes_nothing"
ADDRESSABLE = "test_volumes_every_version_stays_addressable"
SAME_CONTENT = "test_volumes_finalizing_the_same_content_twice_returns_the_same_version"
SYMLINKS = "test_volumes_no_symlink_target_leaves_the_volume_at_any_depth"
READS_LATER = "test_buffer_a_version_reads_later_exactly_as_when_it_was_appended"
ROUND_TRIP = "test_buffer_rows_round_trip_bit_for_bit"
PARENT = "test_buffer_append_forks_the_parent_it_is_given"
RESCORE = "test_buffer_rescore_changes_only_the_rewards_in_a_new_version"
NON_FINITE = "test_buffer_refuses_a_non_finite_reward"

# (implementation, tiers run, the law that names the bug, what its message must say, every law that must fail)
CASES = [
    pytest.param(
        "broken_volumes:LEAKY_FORK",
        "rl_volumes",
        ISOLATION,
        r"and the parent version changed: added \['new\.txt'\], removed \['docs/b\.txt'\], changed.*"
        r"A fork's writes leaked",
        {MACHINE, ISOLATION, NEVER_CHANGES, LOST_WRITER, ADDRESSABLE},
        id="fork mounts its parent's directory",
    ),
    pytest.param(
        "broken_volumes:ONE_DIRECTORY_PER_NAME",
        "rl_volumes",
        NEVER_CHANGES,
        r"changed when a fork of it under the same name was finalized.*never write over a published one",
        {MACHINE, NEVER_CHANGES, ADDRESSABLE},
        id="finalize overwrites the name's published version",
    ),
    pytest.param(
        "broken_volumes:NO_WRITER_LOCK",
        "rl_volumes",
        ONE_WRITER,
        r"returned a second writer while the first is open|returned a second writer while volume 'law-trial' has",
        {MACHINE, ONE_WRITER},
        id="two writers of one name",
    ),
    pytest.param(
        "broken_volumes:STALE_STAGING",
        "rl_volumes",
        LOST_WRITER,
        r"starts from added \['torn\.bin'\].*a dead writer's files must be discarded",
        {MACHINE, LOST_WRITER},
        id="a retried writer inherits the dead one's files",
    ),
    pytest.param(
        "broken_volumes:RANDOM_ID",
        "rl_volumes",
        SAME_CONTENT,
        r"the same build finalized twice gave versions \w+ and \w+: derive a version's id",
        # The rewrite law compares the version of an in-place rewrite with that of the same change written by rename:
        # random ids differ whatever the store published.
        {SAME_CONTENT, "test_volumes_a_file_rewritten_in_place_is_published_with_its_new_content"},
        id="version ids are not content addresses",
    ),
    pytest.param(
        "broken_volumes:SYMLINK_KEEPING",
        "rl_volumes",
        SYMLINKS,
        r"the store published symlinks \['d1/l0 -> \.\./\.\./x'\] and these lead outside the version",
        {SYMLINKS},
        id="a symlink climbing out of the volume published",
    ),
    pytest.param(
        "broken_buffers:IN_PLACE_HEAD",
        "rl_buffer",
        READS_LATER,
        r"holds iterations \[0, 1(, \d)*\] after \d later appends, \[0\] when it was appended: "
        r"a later append rewrote it",
        {READS_LATER, PARENT},
        id="append rewrites the head in place",
    ),
    pytest.param(
        "broken_buffers:ROUNDED_FLOATS",
        "rl_buffer",
        ROUND_TRIP,
        r"is -?0\.333333333333 \(-?0x1\.5555555553de1p-2\), appended as -?0\.3333333333333333",
        {READS_LATER, ROUND_TRIP, RESCORE},
        id="floats written with 12 digits",
    ),
    pytest.param(
        "broken_buffers:NAN_ONLY_REWARDS",
        "rl_buffer",
        f"{NON_FINITE}[inf]",
        r"a row of iteration 2 with reward inf was appended",
        {f"{NON_FINITE}[inf]", f"{NON_FINITE}[-inf]"},
        id="infinite rewards pass a NaN-only check",
    ),
]


@pytest.mark.parametrize(("impl", "tiers", "law", "message", "failing"), CASES)
def test_the_storage_laws_fail_a_broken_implementation_on_the_law_it_breaks(
    pytester, impl, tiers, law, message, failing
):
    run = run_suite(pytester, impl, tiers)
    unexpected = "".join(f"\n--- {name}\n{text[-1500:]}" for name, text in run.reports.items() if name not in failing)
    assert run.failed == failing, f"{impl}: failing laws {sorted(run.failed)}; expected {sorted(failing)}{unexpected}"
    assert not run.skipped, f"{impl}: laws skipped instead of run: {sorted(run.skipped)}"
    report = run.reports[law]
    assert re.search(message, report, re.DOTALL), f"{law} failed without saying {message!r}:\n{report}"
    assert f"--rl-impl {impl}" in report, f"{law}'s report has no reproduce line:\n{report}"


@pytest.mark.parametrize(
    "impl",
    ["rl.conformance.bindings.ours:IN_MEMORY", "broken_volumes:DIR_STORE", "broken_buffers:MEMORY_BUFFER"],
    ids=["ours (IN_MEMORY)", "a copying directory store", "an in-memory buffer"],
)
def test_correct_stores_and_buffers_pass_every_storage_law(pytester, impl):
    """Ours and two written independently of it (so the laws ask for the protocol, not for our design)."""
    run = run_suite(pytester, impl, "rl_volumes or rl_buffer")
    assert not run.failed, run.reports
    provided = {name.split("[")[0] for name in run.passed}
    laws = {case.values[2].split("[")[0] for case in CASES}
    if impl.endswith("IN_MEMORY"):
        assert not run.skipped, sorted(run.skipped)
        assert laws <= provided, f"laws the cases rely on did not run and pass: {sorted(laws - provided)}"
    else:
        assert run.passed, f"{impl} ran no law"
