"""The laws of `rl.protocols.Artifacts`, the `flyte.io.Dir` role: private copies, content addressing, typed absence."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.conformance.support.contract_base import ContractBase, Run, law_settings, must_provide, tier
from rl.protocols import Artifacts
from rl.types import ArtifactRef

__all__ = ["ArtifactsContract", "missing_ref"]


_FILE_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,7}(\.[a-z]{1,3})?", fullmatch=True)
_FILES = st.dictionaries(_FILE_NAMES, st.binary(max_size=64), min_size=1, max_size=4)
"""Small artifacts: one to four flat files (nesting is exercised once, explicitly, in the private-copy law)."""


def missing_ref(ref: ArtifactRef) -> ArtifactRef:
    """A ref of the same form as `ref` whose digest differs in its last character: stored nowhere."""
    last = ref.digest[-1:]
    digest = ref.digest[:-1] + ("1" if last == "0" else "0")
    uri = ref.uri.replace(ref.digest, digest) if ref.digest in ref.uri else ref.uri + ".missing"
    return ArtifactRef(uri=uri, digest=digest)


@tier("artifacts")
class ArtifactsContract(ContractBase):
    """Laws of `rl.protocols.Artifacts`, the `flyte.io.Dir` role: copies, content addressing, typed absence."""

    @pytest.fixture
    def artifacts(self) -> Artifacts:
        """Return a fresh, empty `rl.protocols.Artifacts` store (a new one for each test)."""
        raise must_provide("ArtifactsContract", "artifacts", "a fresh, empty rl.protocols.Artifacts store")

    def test_artifacts_get_returns_a_private_copy(self, artifacts: Artifacts, rl_run: Run[Any]) -> None:
        """Mutating what `put` was given or what `get` returned never changes the stored artifact."""
        original = {"weights.bin": b"\x00\x01\x02", "sub/config.json": b'{"r": 4}'}
        given_files = dict(original)
        ref = rl_run(artifacts.put(given_files, name="law-private-copy"))
        given_files["weights.bin"] = b"changed after put"
        given_files["extra.txt"] = b"added after put"
        first = rl_run(artifacts.get(ref))
        assert first == original, f"get after put returned {sorted(first)}, expected the files as they were put"
        assert all(type(v) is bytes for v in first.values()), "get must return immutable bytes, not a mutable buffer"
        first["weights.bin"] = b"mutated by the consumer"
        del first["sub/config.json"]
        first["intruder.txt"] = b"added by the consumer"
        second = rl_run(artifacts.get(ref))
        assert second == original, "a consumer's changes to what get returned leaked into the stored artifact"

    @law_settings(max_examples=15)
    @given(data=st.data())
    def test_artifacts_put_is_content_addressed(self, artifacts: Artifacts, rl_run: Run[Any], data: Any) -> None:
        """The same files give the same digest whatever their order or name; different files a different digest."""
        files = data.draw(_FILES, label="files")
        other = data.draw(_FILES.filter(lambda f: f != files), label="other files")
        ref = rl_run(artifacts.put(files, name="law-content-a"))
        reordered = dict(reversed(list(files.items())))
        again = rl_run(artifacts.put(reordered, name="law-content-b"))
        assert again.digest == ref.digest, (
            f"equal files put twice gave digests {ref.digest!r} and {again.digest!r}: put must be content-addressed"
        )
        different = rl_run(artifacts.put(other, name="law-content-c"))
        assert different.digest != ref.digest, f"different files share the digest {ref.digest!r}"
        assert rl_run(artifacts.get(ref)) == files, "get(put(files)) did not return the files"

    def test_artifacts_exists_reports_stored_refs(self, artifacts: Artifacts, rl_run: Run[Any]) -> None:
        """`exists` is True for a ref `put` returned and False for a ref of content never stored."""
        ref = rl_run(artifacts.put({"a.txt": b"present"}, name="law-exists"))
        assert rl_run(artifacts.exists(ref)) is True, f"exists({ref}) is not True right after put returned it"
        absent = missing_ref(ref)
        assert rl_run(artifacts.exists(absent)) is False, f"exists({absent}) is not False for a ref never stored"

    def test_artifacts_get_of_a_missing_ref_raises(self, artifacts: Artifacts, rl_run: Run[Any]) -> None:
        """`get` of a ref this store does not hold raises `FileNotFoundError` (or a subclass), never returns."""
        absent = missing_ref(rl_run(artifacts.put({"a.txt": b"present"}, name="law-missing")))
        with pytest.raises(FileNotFoundError):
            rl_run(artifacts.get(absent))
