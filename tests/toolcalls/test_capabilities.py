"""The capability contracts' own rules, checked when a contract is registered."""

from __future__ import annotations

import dataclasses

import pytest

from toolcalls import capabilities
from toolcalls.capabilities.base import register


@pytest.mark.parametrize("capability_id", sorted(capabilities.REGISTRY))
def test_each_capability_names_the_fields_that_identify_its_object(capability_id: str) -> None:
    capability = capabilities.get(capability_id)
    (example,) = capability.input_schema["examples"]
    assert capability.identity_fields
    assert set(capability.identity_fields) <= set(capability.input_schema["required"])
    # Any other field may change without moving the call to another object.
    for name, value in example.items():
        if name not in capability.identity_fields:
            edited = {**example, name: f"{value}-edited" if isinstance(value, str) else value + 1}
            assert capability.object_ref(edited) == capability.object_ref(example)


def test_a_contract_whose_object_ref_reads_another_field_is_refused() -> None:
    refund = capabilities.get("refund-order-v2")
    leaky = dataclasses.replace(
        refund,
        id="refund-order-leaky",
        object_ref=lambda a: f"order:{a['order_id']}:{a['amount_cents']}",
    )
    with pytest.raises(ValueError, match="object_ref reads"):
        register(leaky)
    assert capabilities.get("refund-order-leaky") is None


def test_identity_fields_must_be_required_arguments() -> None:
    refund = capabilities.get("refund-order-v2")
    with pytest.raises(ValueError, match="required arguments"):
        register(dataclasses.replace(refund, id="refund-order-bad", identity_fields=("reason",)))
