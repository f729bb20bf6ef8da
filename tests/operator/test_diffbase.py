"""handlers.NoDiffBase gives kopf an empty diff base: right only while no handler reads it."""

from __future__ import annotations

import kopf
import pytest

from kubetrain.api import naming
from kubetrain.operator import handlers

pytestmark = pytest.mark.unit


def test_no_handler_needs_a_diff_base() -> None:
    # Change, daemon and timer handlers compare kopf's diff base; with NoDiffBase they would
    # see no change ever. Adding one means going back to kopf.AnnotationsDiffBaseStorage.
    registry = kopf.get_default_registry()  # importing handlers registered them here
    assert list(registry._changing.get_all_handlers()) == []
    assert list(registry._spawning.get_all_handlers()) == []
    watching = sorted(h.id for h in registry._watching.get_all_handlers())
    assert watching == ["trainingjob_event", "workload_event"]  # pods and Services: informer.py


def test_the_essence_is_empty_whatever_the_body() -> None:
    storage = handlers.NoDiffBase(prefix=naming.GROUP, key="last-handled-configuration")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    assert storage.build(body=kopf.Body(pod)) == {}
