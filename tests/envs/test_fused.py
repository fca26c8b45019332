"""The CPU backend's fused step (robotrl/envs/fused.py) against its step code on the calling thread, and the batch it
runs on (robotrl/envs/native_batch.py) against `mujoco.batch.Batch`."""

import copy
import gc

import mujoco
import numpy as np
import pytest
from mujoco.batch import Batch, SimulationError

from robotrl.envs import Randomization, list_tasks, make
from robotrl.envs.fused import c_struct
from robotrl.envs.native_batch import NativeBatch


def _pair(task, randomization=None, n=4):
    envs = [
        make(
            task,
            num_envs=n,
            seed=0,
            render_images=False,
            randomization=randomization,
            compile_task=True,
            fuse_step=fuse,
        )
        for fuse in (True, False)
    ]
    for env in envs:
        env.reset(seed=0)
    return envs


@pytest.mark.parametrize("task", list_tasks())
@pytest.mark.parametrize("randomized", [False, True])
def test_the_fused_step_equals_the_step_code_on_the_calling_thread_bit_for_bit(task, randomized):
    """Observations, rewards, ends, infos and whole states (sensors, goals, step counts, the solver's warm start)
    equal over steps that end episodes (auto-resets, fused where the task's reset compiles) and across a reset of
    every env, with per-env models and delayed actions when randomized."""
    rz = Randomization(friction=(0.8, 1.2), mass=(0.8, 1.2), latency_steps=(0, 1)) if randomized else None
    fused, plain = _pair(task, rz)
    rng = np.random.default_rng(0)
    low, high = fused.action_space.low, fused.action_space.high
    ends = 0
    for t in range(70):
        if t == 60:
            for key, value in fused.reset(seed=1)[0].items():
                np.testing.assert_array_equal(value, plain.reset(seed=1)[0][key], err_msg=key)
        u = rng.uniform(low, high).astype(np.float32)
        (obs_f, r_f, te_f, tr_f, info_f), (obs_p, r_p, te_p, tr_p, info_p) = fused.step(u), plain.step(u)
        assert obs_f.keys() == obs_p.keys()
        for key in obs_f:
            np.testing.assert_array_equal(obs_f[key], obs_p[key], err_msg=key)
        for a, b in ((r_f, r_p), (te_f, te_p), (tr_f, tr_p), (info_f["success"], info_p["success"])):
            np.testing.assert_array_equal(a, b)
        assert info_f.keys() == info_p.keys()
        for key in info_f.get("final_obs", {}):  # the observations the episodes ended with
            np.testing.assert_array_equal(info_f["final_obs"][key], info_p["final_obs"][key], err_msg=key)
        ends += int((te_f | tr_f).sum())
        states = fused.get_state(), plain.get_state()
        for key in states[1]:
            np.testing.assert_array_equal(states[0][key], states[1][key], err_msg=key)
    assert fused._fused is not None and plain._fused is None  # each ran the path it names
    assert fused._fused.resets == (task != "PickPlace")  # (PickPlace's reset sorts: the lowering leaves it numpy)
    # an ended episode starts its next inside the step's own call, but where per-env models change at a reset
    assert fused._fused.resets_in_step == (task != "PickPlace" and not randomized)
    if task in ("Quadruped", "Reach"):
        assert ends > 0  # the auto-reset was on the path


def test_episodes_started_inside_the_step_continue_exactly_from_a_saved_state():
    """Each env's next episode is drawn when its episode starts (`get_state()["next_draws"]`), so that the step's
    own call can start it: a fresh env given a mid-run state and the reset stream's state continues bit for bit
    through the auto-resets that follow, final observations included."""
    envs = [make("Quadruped", num_envs=4, seed=s, render_images=False, compile_task=True) for s in (0, 7)]
    envs[0].reset(seed=0)
    envs[1].reset(seed=3)  # another run's episodes, left behind by the restore
    rng = np.random.default_rng(0)
    low, high = envs[0].action_space.low, envs[0].action_space.high
    actions = [rng.uniform(low, high).astype(np.float32) for _ in range(60)]
    for u in actions[:10]:
        envs[0].step(u)
    envs[1].set_state(envs[0].get_state())
    envs[1].set_rng_state(envs[0].get_rng_state())
    ends = 0
    for u in actions[10:]:
        (obs_a, r_a, te_a, tr_a, info_a), (obs_b, r_b, te_b, tr_b, info_b) = (env.step(u) for env in envs)
        for a, b in ((r_a, r_b), (te_a, te_b), (tr_a, tr_b), *((obs_a[k], obs_b[k]) for k in obs_a)):
            np.testing.assert_array_equal(a, b)
        for key in info_a.get("final_obs", {}):
            np.testing.assert_array_equal(info_a["final_obs"][key], info_b["final_obs"][key], err_msg=key)
        ends += int((te_a | tr_a).sum())
    assert ends > 0 and envs[0]._fused is not None and envs[0]._fused.resets_in_step
    np.testing.assert_array_equal(envs[0].get_state()["next_draws"], envs[1].get_state()["next_draws"])


def test_images_and_their_randomization_through_the_fused_reset_equal_the_unfused():
    """An auto-reset fused into the pool call hands the backend's images, camera jitter, light and observation noise
    the same states and draws as the reset on the calling thread."""
    rz = Randomization(camera_pos=0.01, light=0.2, obs_noise=0.01)
    envs = [
        make(
            "Reach?images=true", num_envs=3, seed=0, randomization=rz, render_workers=0, compile_task=True, fuse_step=f
        )
        for f in (True, False)
    ]
    for env in envs:
        env.reset(seed=0)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(65):
        u = rng.uniform(envs[0].action_space.low, envs[0].action_space.high).astype(np.float32)
        (obs_f, _, te, tr, info_f), (obs_p, *_, info_p) = (env.step(u) for env in envs)
        for key in ("state", "image_front"):
            np.testing.assert_array_equal(obs_f[key], obs_p[key], err_msg=key)
            if "final_obs" in info_f:
                np.testing.assert_array_equal(info_f["final_obs"][key], info_p["final_obs"][key], err_msg=key)
        ends += int((te | tr).sum())
    assert ends > 0 and envs[0]._fused is not None and envs[0]._fused.resets


def test_a_refused_action_steps_no_simulation():
    """A NaN action is refused before the physics call: nothing steps, in any env."""
    env, _ = _pair("Reach", n=3)
    env.step(np.zeros((3, 3), np.float32))
    before = env.get_state()["physics"].copy()
    bad = np.zeros((3, 3), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN/inf in env\(s\) \[1\]"):
        env.step(bad)
    np.testing.assert_array_equal(env.get_state()["physics"], before)


def test_the_switch_and_the_option():
    assert make("Reach", num_envs=2, seed=0).fuse_step  # (the suite's envs compile nothing unless asked: conftest)
    assert not make("Reach", num_envs=2, seed=0, fuse_step=False).fuse_step
    with pytest.raises(ValueError, match="fuse_step: an option of the cpu backend"):
        make("Reach", num_envs=2, backend="mjx", fuse_step=True)


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("ROBOTRL_FUSE_STEP", "0")
    env = make("Reach", num_envs=2, seed=0, compile_task=True)
    env.reset(seed=0)
    env.step(np.zeros((2, 3), np.float32))
    assert not env.fuse_step and env._fused is None


@pytest.mark.parametrize("task", list_tasks())
def test_mjdatas_layout_from_mujocos_declarations_matches_its_arrays(task):
    model = make(task, num_envs=1, render_images=False).task.model
    data = mujoco.MjData(model)
    view = c_struct("mjData").from_address(data._address)
    for name in ("qpos", "qvel", "ctrl", "sensordata", "qacc_warmstart", "xpos", "act", "mocap_pos"):
        if getattr(data, name).size:
            assert getattr(view, name) == getattr(data, name).ctypes.data, name
    data.time = 1.25
    assert view.time == 1.25


def test_the_native_batch_steps_as_mujocos_batch():
    model = make("Quadruped", num_envs=1, render_images=False).task.model
    ours, theirs = NativeBatch(model, 5, 2), Batch(model, 5, nthread=2)
    rng = np.random.default_rng(0)
    for b in (ours, theirs):
        b.reset(stage=mujoco.mjtStage.mjSTAGE_NONE)
        b.bind("sensordata")
    np.testing.assert_array_equal(ours.state, theirs.state)
    nudge = 0.01 * rng.standard_normal(ours.bind("qpos").shape)
    for b in (ours, theirs):
        b.bind("qpos")[:] += nudge
        b.forward(np.array([1, 3]))
    for _ in range(30):
        u = rng.uniform(-1, 1, ours.bind("ctrl").shape)
        for b in (ours, theirs):
            b.bind("ctrl")[:] = u
            b.step(nstep=4)
    np.testing.assert_array_equal(ours.state, theirs.state)
    np.testing.assert_array_equal(ours.bind("sensordata"), theirs.bind("sensordata"))
    np.testing.assert_array_equal(ours.warning, theirs.warning)
    heavy = [copy.copy(model) if i % 2 else model for i in range(5)]  # per-simulation models, as randomized
    for m in heavy[1::2]:
        m.body_mass[:] *= 2.0
    ours.set_models(heavy)
    theirs.set_models(heavy)
    for b in (ours, theirs):
        b.step(nstep=4)
    np.testing.assert_array_equal(ours.state, theirs.state)


def test_the_native_batchs_arrays_keep_it_alive_and_bad_ids_are_named():
    model = make("Reach", num_envs=1, render_images=False).task.model
    batch = NativeBatch(model, 3, 1)
    batch.reset(stage=mujoco.mjtStage.mjSTAGE_NONE)
    rows = batch.state
    expected = rows.copy()
    del batch
    gc.collect()
    np.testing.assert_array_equal(rows, expected)  # the memory is still the batch's
    with pytest.raises(ValueError, match=r"ids must be in \[0, 2\)"):
        NativeBatch(model, 2, 1).forward(np.array([0, 2]))


def test_an_error_in_a_simulation_is_raised_naming_it_and_the_batch_goes_on():
    """MuJoCo raising in a simulation (here its stack too small for the contacts) is `SimulationError`, from `step` and
    from a function of ours that `apply` runs, as the fused step's does, call after call."""
    import numba
    from numba import types

    from robotrl.envs.fused import free_stack, mark_stack, mj_step

    @numba.cfunc(types.void(types.voidptr, types.voidptr, types.int32, types.voidptr), nogil=True)
    def step_once(m, d, sim, arg):
        mark_stack(d)
        mj_step(m, d)
        free_stack(d)

    xml = """<mujoco><size memory="{}"/><worldbody><geom type="plane" size="1 1 .1"/>
      <body><freejoint/><geom size=".1"/></body><body pos="0 0 .15"><freejoint/><geom size=".1"/></body>
      </worldbody></mujoco>"""
    batch = NativeBatch(mujoco.MjModel.from_xml_string(xml.format("4K")), 3, 2)
    batch.reset(stage=mujoco.mjtStage.mjSTAGE_NONE)
    with pytest.raises(SimulationError, match=r"in 3 of 3 simulations \(0, 1, 2\).*out of memory") as raised:
        batch.step(nstep=2)
    np.testing.assert_array_equal(raised.value.ids, [0, 1, 2])
    for _ in range(2):
        with pytest.raises(SimulationError, match="out of memory"):
            batch.apply(step_once.address, 0)
    fine = NativeBatch(mujoco.MjModel.from_xml_string(xml.format("1M")), 3, 2)
    fine.reset(stage=mujoco.mjtStage.mjSTAGE_NONE)
    fine.apply(step_once.address, 0)
    assert (fine.state[:, 0] > 0).all()  # time advanced in every simulation


def test_a_step_that_cannot_be_fused_warns_once_and_runs_its_code_on_the_calling_thread(monkeypatch):
    import robotrl.envs.fused as fused_module

    def unreadable() -> None:
        raise RuntimeError("mjData's layout from mujoco.introspect does not match MjData.qpos")

    monkeypatch.setattr(fused_module, "data_offsets", unreadable)
    env, plain = _pair("Reach", n=2)
    with pytest.warns(UserWarning, match=r"Reach: step not fused \(RuntimeError: mjData's layout"):
        obs, *_ = env.step(np.ones((2, 3), np.float32))
    assert not env.fuse_step and env._fused is None
    np.testing.assert_array_equal(obs["state"], plain.step(np.ones((2, 3), np.float32))[0]["state"])


@pytest.mark.parametrize("task", ["Reach", "Quadruped"])
def test_a_blow_up_steps_as_unfused(task):
    """MuJoCo resets a simulation that blows up within mj_step, the thread's mjData stack included: the fused step
    keeps nothing there across the physics, and reports the blow-up as the unfused step does, results for results."""
    envs = _pair(task, n=3)
    for env in envs:
        state = env.get_state()
        nq = env.task.model.nq
        state["physics"][1, 1 + nq : 1 + nq + env.task.model.nv] = 1e300  # env 1 flies apart
        env.set_state(state)
    u = np.full((3, *envs[0].action_space.shape[1:]), 0.5, np.float32)
    for _ in range(3):
        (obs_f, r_f, te_f, tr_f, info_f), (obs_p, r_p, te_p, tr_p, info_p) = (env.step(u) for env in envs)
        for key in obs_f:
            np.testing.assert_array_equal(obs_f[key], obs_p[key], err_msg=key)
        for a, b in ((r_f, r_p), (te_f, te_p), (tr_f, tr_p), (info_f["diverged"], info_p["diverged"])):
            np.testing.assert_array_equal(a, b)
    assert envs[0]._fused is not None
    np.testing.assert_array_equal(envs[0].get_state()["physics"], envs[1].get_state()["physics"])
