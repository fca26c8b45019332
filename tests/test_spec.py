import json

import numpy as np
import pytest

from robotrl.core.spec import ArraySpec, Spec, SpecMismatchError


def make_spec(**overrides):
    base = dict(
        task="Reach",
        observations={
            "state": ArraySpec((23,), "float32"),
            "image_front": ArraySpec((64, 64, 3), "uint8", 0, 255),
            "instruction": ArraySpec((), "str"),
        },
        action=ArraySpec((3,), "float32", -1.0, 1.0),
        action_mode="ee_delta",
        control_hz=20.0,
        joint_names=("j1", "j2"),
        joint_limits=((-1.0, 1.0), (-2.0, 2.0)),
        episode_steps=60,
    )
    base.update(overrides)
    return Spec(**base)


def test_json_round_trip_is_exact():
    spec = make_spec()
    text = spec.to_json()
    json.loads(text)  # valid JSON
    back = Spec.from_json(text)
    assert back == spec
    assert back.observations["image_front"].is_image
    spec.check(back)


def test_infinite_bounds_survive_json():
    spec = make_spec(observations={"state": ArraySpec((2,), "float32", -np.inf, np.inf)})
    text = spec.to_json()
    assert "Infinity" not in text  # strict JSON
    assert Spec.from_json(text).observations["state"].high == (np.inf, np.inf)


@pytest.mark.parametrize(
    "override, field, theirs",
    [
        ({"control_hz": 10.0}, "spec.control_hz", "10.0"),
        ({"action": ArraySpec((4,), "float32", -1, 1)}, "spec.action.shape", "[4]"),
        ({"observations": {"state": ArraySpec((22,), "float32")}}, "spec.observations.state.shape", "[22]"),
        ({"joint_names": ("j1", "jX")}, "spec.joint_names", "'jX'"),
        ({"task": "PushT"}, "spec.task", "'PushT'"),
    ],
)
def test_check_names_first_differing_field_and_both_values(override, field, theirs):
    ours, other = make_spec(), make_spec(**override)
    with pytest.raises(SpecMismatchError) as err:
        ours.check(other, "policy", "env")
    msg = str(err.value)
    assert msg.startswith(field), msg
    assert "policy has" in msg and "env has" in msg and theirs in msg


def test_metadata_does_not_make_specs_incompatible():
    make_spec(metadata={"note": "a"}).check(make_spec(metadata={"note": "b"}))


def test_bad_spec_inputs_are_clear_errors():
    with pytest.raises(SpecMismatchError, match="joint_limits"):
        make_spec(joint_limits=((-1.0, 1.0),))
    with pytest.raises(SpecMismatchError, match="Spec.action"):
        make_spec(action=ArraySpec((3,), "float32"))
    with pytest.raises(TypeError):
        ArraySpec((3,), "not_a_dtype")
    with pytest.raises(SpecMismatchError, match="unknown field"):
        Spec.from_dict({**make_spec().to_dict(), "extra": 1})


def test_array_validation_names_where():
    spec = ArraySpec((3,), "float32")
    spec.validate(np.zeros((5, 3), np.float32), "obs['state']")
    with pytest.raises(SpecMismatchError, match=r"obs\['state'\]: expected shape \(num_envs, 3\), got \(5, 4\)"):
        spec.validate(np.zeros((5, 4)), "obs['state']")
    with pytest.raises(SpecMismatchError, match="expected dtype uint8"):
        ArraySpec((2, 2, 3), "uint8").validate(np.zeros((1, 2, 2, 3), np.float32), "image")
