"""The method registry: built-in entries, references, registration and refusals."""

import pytest

from draftsmith.common.errors import ConfigError
from draftsmith.common.registry import ARTEFACT_KINDS, REGISTRY, MethodSpec, Registry, registered, resolve


def test_builtin_methods_resolve():
    assert {"ar", "draft", "pld", "distillspec"} <= set(REGISTRY.names())
    assert set(REGISTRY.names(eval_method=True)) >= {"ar", "draft", "pld"}
    assert {"distillspec", "medusa"} <= set(REGISTRY.names(trained=True))
    assert not {"ar", "draft", "pld"} & set(REGISTRY.names(trained=True))
    for name in REGISTRY.names():
        spec = REGISTRY.get(name)
        assert callable(resolve(spec.proposer)) and spec.artefact_kind in ARTEFACT_KINDS
        if spec.trained:
            assert resolve(spec.config) and resolve(spec.trainer)


def test_registration_is_scoped_and_refuses_duplicates():
    spec = MethodSpec(name="scoped", summary="", proposer=lambda ctx: None)
    with registered(spec):
        assert REGISTRY.get("scoped") is spec
        with pytest.raises(ConfigError, match="already registered"):
            REGISTRY.register(spec)
    with pytest.raises(ConfigError, match="not known"):
        REGISTRY.get("scoped")


@pytest.mark.parametrize("kwargs, match", [
    ({"artefact_kind": "tarball"}, "artefact_kind"),
    ({"models": ("draft",)}, "must include 'target'"),
    ({"config": object}, "both config and trainer"),
])
def test_bad_specs_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MethodSpec(name="bad", summary="", proposer=lambda ctx: None, **kwargs)


def test_references_name_module_and_attribute():
    assert resolve("draftsmith.common.registry:Registry") is Registry
    with pytest.raises(ConfigError, match="package.module:attribute"):
        resolve("draftsmith.common.registry")
