"""Laws of versioned copy-on-write volumes (`rl.protocols.VolumeStore`, `VolumeVersion`, `WritableVolume`): the
`Volume` / `ROVolume` of the training-loop and agentic tutorials, whose forks each have one writer and whose versions
never change.

Subclass the contract and provide one fixture, `volume_store_factory`: a callable returning a fresh, empty store.
Only what the protocols let a caller do is checked: files are written through `mount()` and versions read through
`path()`. A store that needs another way to write or to lose a writer subclasses `VolumeStoreMachine` (`write_file`,
`delete_file`, `lose_writer`) and sets `machine = YourMachine` on its test class. How, and what is left to the
store's own tests: docs/conformance.md#the-volume-laws-how-they-write.
"""

from __future__ import annotations

import contextlib
import gc
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    precondition,
    rule,
)

from rl.conformance.in_place_rewrite_laws import InPlaceRewriteLaws
from rl.conformance.plugin import law_seed
from rl.conformance.support.contract_base import ContractBase, must_provide, tier
from rl.conformance.symlink_containment_laws import SymlinkContainmentLaws
from rl.protocols import VolumeStore, VolumeVersion, WritableVolume

__all__ = ["PATHS", "VolumeStoreContract", "VolumeStoreMachine", "read_tree"]

PATHS = ("a.txt", "b.bin", "d/c.txt", "d/e/f.txt")
"""The files the state machine writes: never a file and a directory at once ("d" is only ever a directory)."""

MAX_OPEN = 3
"""Open writers at once in the state machine: enough for a fork and two siblings."""

StoreFactory = Callable[[], VolumeStore]

MACHINE_SETTINGS = settings(
    max_examples=25,
    stateful_step_count=15,
    deadline=None,
    derandomize=True,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    # The explain phase replays the failing history once per step variation: minutes on a store that copies files.
    phases=tuple(phase for phase in Phase if phase is not Phase.explain),
)
"""The random-history law's settings: deterministic, 25 histories of up to 15 steps, shrunk but not explained."""


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` by POSIX relative path (directories and symlinks are not files)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def describe_change(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> str:
    """What differs between two file trees, shortly: the files added, removed and changed."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    parts = [
        f"{what} {names}" for what, names in (("added", added), ("removed", removed), ("changed", changed)) if names
    ]
    return ", ".join(parts) or "no difference"


def refuse_second_writer(machine: Any, name: str, attempts: Mapping[str, Callable[[], WritableVolume]]) -> None:
    """Each attempt to open a second writer of `name` (while one is open) must raise; a returned writer is lost again
    (`machine.lose_writer`) before the failure is reported."""
    for how, attempt in attempts.items():
        try:
            second = attempt()
        except Exception:
            continue
        machine.lose_writer(second)
        raise AssertionError(
            f"{how}({name!r}) returned a second writer while volume {name!r} has an open one: each fork has exactly "
            "one writer (two would race to publish the same name); refuse the second with an error until the first "
            "finalizes or dies"
        )


class VolumeStoreMachine(RuleBasedStateMachine):
    """Random new / fork / write / delete / finalize / lost-writer / second-writer sequences on one fresh store,
    checked against a model `{version id: {path: bytes}}`: every finalized version reads back exactly, always, and
    each open fork sees exactly its own writes."""

    def __init__(self, new_store: StoreFactory) -> None:
        super().__init__()
        self.store = new_store()
        self.finalized: dict[str, dict[str, bytes]] = {}
        self.names: dict[str, str] = {}
        self.open: dict[str, tuple[WritableVolume, dict[str, bytes]]] = {}
        self.lost: list[str] = []
        # Unique per machine, so a store that outlives one run (a shared service) never sees a name twice.
        self.prefix = f"law-{uuid.uuid4().hex[:8]}"
        self.counter = 0
        self.before = {v.version for v in self.store.versions()}

    # -- how the laws touch a volume (override in a subclass if yours needs another way) -------------------------------

    @staticmethod
    def write_file(rw: WritableVolume, relpath: str, data: bytes) -> None:
        """Write `relpath` in the fork: a new file beside it, renamed over the name (never the old inode in place)."""
        path = rw.mount() / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.law-{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    @staticmethod
    def delete_file(rw: WritableVolume, relpath: str) -> None:
        """Delete `relpath` from the fork (a directory entry only: the parent keeps its copy)."""
        os.unlink(rw.mount() / relpath)

    @staticmethod
    def lose_writer(rw: WritableVolume) -> None:
        """Called just before the laws drop every reference to an unfinalized writer and collect garbage: what a killed
        process does. Nothing by default; a store whose in-process writer must be told it died does it here."""

    # -- rules ---------------------------------------------------------------------------------------------------------

    def fresh_name(self) -> str:
        self.counter += 1
        return f"{self.prefix}-{self.counter}"

    def record(self, version: VolumeVersion, name: str, model: dict[str, bytes]) -> None:
        known = self.finalized.get(version.version)
        assert known is None or (known == model and self.names[version.version] == name), (
            f"finalizing volume {name!r} returned version {version.version}, which volume "
            f"{self.names.get(version.version)!r} already published with other files: a new name, parent or content "
            "must give a new version"
        )
        assert version.name == name, f"finalizing volume {name!r} returned a version named {version.name!r}"
        got = read_tree(version.path())
        assert got == model, (
            f"volume {name!r} finalized as {version.version} does not hold what its writer wrote: "
            f"{describe_change(model, got)}"
        )
        self.finalized[version.version] = model
        self.names[version.version] = name

    @initialize(files=st.dictionaries(st.sampled_from(PATHS), st.binary(max_size=32), max_size=3))
    def build_world(self, files: dict[str, bytes]) -> None:
        name = self.fresh_name()
        rw = self.store.new(name)
        for path, content in files.items():
            self.write_file(rw, path, content)
        self.record(rw.finalize("world"), name, dict(files))

    def pick_open(self, data: st.DataObject) -> str:
        """An open writer's name, forking one first if none is open (preconditions would leave most rules disabled)."""
        if not self.open:
            self.fork(data)
        return data.draw(st.sampled_from(list(self.open)), label="writer")

    @precondition(lambda self: len(self.open) < MAX_OPEN)
    @rule()
    def new_volume(self) -> None:
        name = self.fresh_name()
        self.open[name] = (self.store.new(name), {})

    @precondition(lambda self: len(self.open) < MAX_OPEN)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        version = data.draw(st.sampled_from(list(self.finalized)), label="parent")
        own = self.names[version]
        # Reusing a lost writer's name must start from the parent, not from the files the dead writer left behind; a
        # fork under its parent's own name is how a buffer grows, and must leave the parent as it was.
        if self.lost:
            name = self.lost.pop()
        elif own not in self.open and own not in self.lost and data.draw(st.booleans(), label="parent's name"):
            name = own
        else:
            name = self.fresh_name()
        self.open[name] = (self.store.open(version).fork(name), dict(self.finalized[version]))

    @rule(data=st.data(), path=st.sampled_from(PATHS), content=st.binary(max_size=32))
    def write(self, data: st.DataObject, path: str, content: bytes) -> None:
        rw, model = self.open[self.pick_open(data)]
        self.write_file(rw, path, content)
        model[path] = content

    @rule(data=st.data(), path=st.sampled_from(PATHS))
    def delete(self, data: st.DataObject, path: str) -> None:
        rw, model = self.open[self.pick_open(data)]
        if path in model:
            self.delete_file(rw, path)
            del model[path]

    @rule(data=st.data(), message=st.text(max_size=8))
    def finalize(self, data: st.DataObject, message: str) -> None:
        name = self.pick_open(data)
        rw, model = self.open.pop(name)
        self.record(rw.finalize(message), name, model)

    @rule(data=st.data())
    def writer_lost_before_finalize(self, data: st.DataObject) -> None:
        name = self.pick_open(data)
        rw, _ = self.open.pop(name)
        self.write_file(rw, "torn.bin", b"half a rec")
        self.lose_writer(rw)
        del rw
        gc.collect()
        self.lost.append(name)

    @rule(data=st.data())
    def second_writer_is_refused(self, data: st.DataObject) -> None:
        name = self.pick_open(data)
        parent = self.store.open(data.draw(st.sampled_from(list(self.finalized)), label="parent"))
        refuse_second_writer(self, name, {"new": lambda: self.store.new(name), "fork": lambda: parent.fork(name)})

    # -- invariants ----------------------------------------------------------------------------------------------------

    @invariant()
    def every_finalized_version_reads_back_exactly(self) -> None:
        listed = {v.version for v in self.store.versions()} - self.before
        unfinalized = sorted(listed - set(self.finalized))
        assert not unfinalized, f"versions {unfinalized} are listed but no writer finalized them"
        missing = sorted(set(self.finalized) - listed)
        assert not missing, f"finalized versions {missing} are not listed by versions()"
        for version, model in self.finalized.items():
            got = read_tree(self.store.open(version).path())
            assert got == model, (
                f"version {version} of volume {self.names[version]!r} changed after it was finalized: "
                f"{describe_change(model, got)}. A fork's writes or a later finalize reached a published version: "
                "give each fork its own copy of its parent's files, and never write a published version again"
            )

    @invariant()
    def each_fork_sees_only_its_own_writes(self) -> None:
        for name, (rw, model) in self.open.items():
            got = read_tree(rw.mount())
            assert got == model, (
                f"the open fork {name!r} does not hold its parent's files plus its own writes: "
                f"{describe_change(model, got)} (another fork's or a dead writer's files, or its own writes lost)"
            )

    def teardown(self) -> None:
        for rw, _ in self.open.values():
            self.lose_writer(rw)
        self.open.clear()
        gc.collect()


def _bad_name_message(name: str) -> str:
    return (
        f"a volume named {name!r} was accepted: a name is one path component, so a name with '/', '..' or nothing "
        "in it could address a directory outside the store; raise ValueError (or a subclass)"
    )


BAD_NAMES = ("", ".", "..", "../escape", "a/b", "/abs")
"""Names that are not one safe path component: every store must refuse them."""


@tier("volumes")
class VolumeStoreContract(SymlinkContainmentLaws, InPlaceRewriteLaws, ContractBase):
    """Laws of `rl.protocols.VolumeStore` and its `VolumeVersion` / `WritableVolume`: a fork's writes stay in the fork,
    a published version never changes, one writer per name, a writer that dies publishes nothing, every version stays
    addressable, the same content is the same version, and names cannot leave the store."""

    machine: ClassVar[type[VolumeStoreMachine]] = VolumeStoreMachine
    """The state machine the random-history law runs; subclass it to add rules or change how files are written."""

    @pytest.fixture
    def volume_store_factory(self) -> StoreFactory:
        """Return a zero-argument callable that returns a fresh, empty `rl.protocols.VolumeStore` each call (the state
        machine opens one per example)."""
        raise must_provide(
            "VolumeStoreContract",
            "volume_store_factory",
            "a zero-argument callable that returns a fresh, empty rl.protocols.VolumeStore each call "
            "(e.g. lambda: MyVolumeStore(tempfile.mkdtemp(dir=tmp_path)))",
        )

    @pytest.fixture
    def volume_store(self, volume_store_factory: StoreFactory) -> VolumeStore:
        """One fresh store from `volume_store_factory`."""
        return volume_store_factory()

    def build(self, store: VolumeStore, name: str, files: Mapping[str, bytes], message: str = "build") -> VolumeVersion:
        """A version of a new volume `name` holding `files`."""
        rw = store.new(name)
        for rel, data in files.items():
            self.machine.write_file(rw, rel, data)
        return rw.finalize(message)

    def test_volumes_random_histories_match_a_dict_model(
        self, volume_store_factory: StoreFactory, rl_seed: int
    ) -> None:
        """Any sequence of new volumes, forks (under new names or their parent's), writes, deletes, finalizes, second
        writers and writers lost before finalize keeps every finalized version exactly as finalized, lists exactly the
        finalized versions, and shows each open fork its parent's files plus its own writes only."""
        law = type(self).test_volumes_random_histories_match_a_dict_model
        # Read at every call, like a @given law's, so `--rl-examples` and the self-test's settings reach the machine.
        chosen = getattr(law, "_hypothesis_internal_use_settings", MACHINE_SETTINGS)
        factory: Any = lambda: self.machine(volume_store_factory)  # noqa: E731  (a factory, as hypothesis accepts)
        machine_test = get_state_machine_test(factory, settings=chosen)
        if rl_seed != 0:
            # The seed the plugin gives a @given law under --rl-seed N (MACHINE_SETTINGS keep no database either).
            machine_test = hypothesis.seed(law_seed(rl_seed, law.__qualname__))(machine_test)
        # The machine collects garbage after each lost writer and each example, as a killed process frees its writer. A
        # full collection walks every object the process holds (torch's, a whole test session's): a third of this law's
        # time. Objects that existed before the machine started are frozen out of it (unless the caller froze them
        # already, as our test session does: unfreezing would undo that); everything the machine creates, its writers
        # included, is collected as before.
        if gc.get_freeze_count():
            machine_test()
            return
        gc.collect()
        gc.freeze()
        try:
            machine_test()
        finally:
            gc.unfreeze()

    def test_volumes_implement_the_protocols(self, volume_store: VolumeStore) -> None:
        """The store is a `VolumeStore`, a writer a `WritableVolume`, a finalized version a `VolumeVersion`."""
        assert isinstance(volume_store, VolumeStore), f"{type(volume_store).__name__} lacks new, open or versions"
        rw = volume_store.new("law-protocols")
        assert isinstance(rw, WritableVolume), f"new() returned a {type(rw).__name__}, not a WritableVolume"
        version = rw.finalize("protocols")
        assert isinstance(version, VolumeVersion), f"finalize returned a {type(version).__name__}, not a VolumeVersion"
        assert (version.name, volume_store.open(version.version).version) == ("law-protocols", version.version)

    def test_volumes_a_forks_writes_are_invisible_to_its_parent_and_siblings(self, volume_store: VolumeStore) -> None:
        """Writing, replacing and deleting files in one fork changes neither the version it forked nor a sibling fork
        of the same version; each fork finalizes into exactly its own files."""
        files = {"docs/a.txt": b"alpha", "docs/b.txt": b"beta"}
        world = self.build(volume_store, "law-world", files)
        one, two = world.fork("law-one"), world.fork("law-two")
        self.machine.write_file(one, "docs/a.txt", b"changed")
        self.machine.write_file(one, "new.txt", b"new")
        self.machine.delete_file(one, "docs/b.txt")
        for what, tree in (("the parent version", read_tree(world.path())), ("a sibling fork", read_tree(two.mount()))):
            assert tree == files, (
                f"fork 'law-one' replaced docs/a.txt, added new.txt and deleted docs/b.txt, and {what} changed: "
                f"{describe_change(files, tree)}. A fork's writes leaked: give each fork its own copy of its parent's "
                "files (copy-on-write), never the parent's directory or mutable objects"
            )
        v1 = one.finalize("one")
        v2 = two.finalize("two")
        assert read_tree(v1.path()) == {"docs/a.txt": b"changed", "new.txt": b"new"}
        assert read_tree(v2.path()) == files, "a sibling finalized after another fork did not keep its parent's files"
        assert read_tree(world.path()) == files, "the parent changed once its forks finalized"

    def test_volumes_a_finalized_version_never_changes(self, volume_store: VolumeStore) -> None:
        """Forking a version under its own name, writing and finalizing again (a buffer's next iteration) publishes a
        new version and leaves the old one, read by id, exactly as it was; so does writing into a finalized writer's
        mount, if the store allows the call at all."""
        files = {"iter-1": b"1"}
        first = self.build(volume_store, "law-buffer", files, "first")
        rw = first.fork("law-buffer")
        self.machine.write_file(rw, "iter-2", b"2")
        self.machine.write_file(rw, "iter-1", b"rewritten")
        second = rw.finalize("second")
        assert second.version != first.version, "finalizing new content returned the old version"
        old = read_tree(volume_store.open(first.version).path())
        assert old == files, (
            f"version {first.version} changed when a fork of it under the same name was finalized: "
            f"{describe_change(files, old)}. Finalize must publish a new version, never write over a published one "
            "(e.g. one directory per volume name)"
        )
        # A store may refuse the call (ours raises); what it must never do is let the write reach a version.
        with contextlib.suppress(Exception):
            self.machine.write_file(rw, "after.txt", b"written after finalize")
        for version, want in ((first, files), (second, {"iter-1": b"rewritten", "iter-2": b"2"})):
            got = read_tree(volume_store.open(version.version).path())
            assert got == want, (
                f"writing into a finalized writer's mount changed version {version.version}: "
                f"{describe_change(want, got)}. Once finalized, a writer must refuse writes or write nowhere a version "
                "reads from"
            )

    def test_volumes_a_second_writer_of_a_name_is_refused(self, volume_store: VolumeStore) -> None:
        """While a name has an open writer, `new(name)` and `fork(name)` raise; once it finalizes the name is free."""
        world = self.build(volume_store, "law-world", {"a.txt": b"a"})
        rw = world.fork("law-trial")
        refuse_second_writer(
            self.machine,
            "law-trial",
            {"new": lambda: volume_store.new("law-trial"), "fork": lambda: world.fork("law-trial")},
        )
        rw.finalize("done")
        world.fork("law-trial").finalize("again")

    def test_volumes_a_writer_lost_before_finalize_publishes_nothing(self, volume_store: VolumeStore) -> None:
        """A writer lost after writing but before finalizing (its process killed) publishes nothing, and the name's
        next writer starts from its parent's files, not from what the dead writer left behind."""
        files = {"a.txt": b"a"}
        world = self.build(volume_store, "law-world", files)
        before = sorted(v.version for v in volume_store.versions())
        rw = world.fork("law-trial")
        self.machine.write_file(rw, "a.txt", b"uncommitted")
        self.machine.write_file(rw, "torn.bin", b"half")
        self.machine.lose_writer(rw)
        del rw
        gc.collect()
        after = sorted(v.version for v in volume_store.versions())
        assert after == before, f"a writer that never finalized published {sorted(set(after) - set(before))}"
        retry = world.fork("law-trial")
        got = read_tree(retry.mount())
        assert got == files, (
            f"the next writer of 'law-trial' (a retried task) starts from {describe_change(files, got)} relative to "
            "its parent: a dead writer's files must be discarded, never inherited"
        )
        retry.finalize("retry")

    def test_volumes_every_version_stays_addressable(self, volume_store: VolumeStore) -> None:
        """Each version opens by its id, with its own files, after later versions of its volume; the volume's name
        opens its latest version; `versions(name)` lists them all, oldest first."""
        v1 = self.build(volume_store, "law-buffer", {"iter-1": b"1"}, "first")
        rw = v1.fork("law-buffer")
        self.machine.write_file(rw, "iter-2", b"2")
        v2 = rw.finalize("second")
        self.build(volume_store, "law-other", {"x": b"x"})
        assert volume_store.open(v1.version).version == v1.version, "open(id) of the first version returned another"
        assert read_tree(volume_store.open(v1.version).path()) == {"iter-1": b"1"}
        assert volume_store.open("law-buffer").version == v2.version, "open(name) is not the volume's latest version"
        listed = [v.version for v in volume_store.versions("law-buffer")]
        assert listed == [v1.version, v2.version], (
            f"versions('law-buffer') listed {listed}, expected both versions of that volume, oldest first"
        )
        with pytest.raises(LookupError):
            volume_store.open("law-never-published")

    def test_volumes_finalizing_the_same_content_twice_returns_the_same_version(
        self, volume_store: VolumeStore
    ) -> None:
        """A retried build (same name, parent, message and files) returns the version already published, so a task
        retried after it finalized adds no second version."""
        files = {"docs/a.txt": b"alpha", "b.bin": b"\x00\x01"}
        first = self.build(volume_store, "law-world", files)
        again = self.build(volume_store, "law-world", dict(reversed(list(files.items()))))
        assert again.version == first.version, (
            f"the same build finalized twice gave versions {first.version} and {again.version}: derive a version's id "
            "from its name, parent, message and files (content addressing), so a retried task is idempotent"
        )
        assert [v.version for v in volume_store.versions("law-world")] == [first.version]

    @pytest.mark.parametrize("bad", BAD_NAMES)
    def test_volumes_names_that_are_not_one_path_component_are_refused(
        self, volume_store: VolumeStore, bad: str
    ) -> None:
        """`new` and `fork` refuse a name that is empty, '.', '..', or holds a '/': it could leave the store."""
        world = self.build(volume_store, "law-world", {"a.txt": b"a"})
        for how, call in (("new", volume_store.new), ("fork", world.fork)):
            try:
                call(bad)
            except ValueError:
                continue
            raise AssertionError(f"{how}: {_bad_name_message(bad)}")
        assert [v.version for v in volume_store.versions()] == [world.version], "a refused name published a version"


# Where hypothesis keeps a @given law's settings, which the plugin's --rl-examples and the self-test change: the
# random-history law reads its own from there.
VolumeStoreContract.test_volumes_random_histories_match_a_dict_model._hypothesis_internal_use_settings = (  # type: ignore[attr-defined]
    MACHINE_SETTINGS
)
