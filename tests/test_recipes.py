"""Recipes (robotrl/stages/recipes): every file loads, every budget validates against its task and policy, and a
broken file is refused in one line naming the file and the field."""

from pathlib import Path

import pytest

from robotrl.stages.recipes import BUDGETS, RECIPE_DIR, PpoSettings, Recipe, RecipeError, load_recipe, recipe_for

RECIPES = sorted(RECIPE_DIR.glob("*.yaml"))


def test_every_builtin_task_has_a_recipe():
    from robotrl.envs import list_tasks

    assert set(list_tasks()) <= {load_recipe(p).task for p in RECIPES}
    assert recipe_for("Quadruped").policy == "gaussian"  # a legged robot learns to walk by PPO, not from demos


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_each_recipe_validates_against_its_task_and_policy(path: Path):
    from robotrl.envs import make_task
    from robotrl.policies.base import config_from_dict, policy_config
    from robotrl.stages.pipeline import PipelineConfig, check_policy

    recipe = load_recipe(path)
    assert path.stem.split("-")[0] == recipe.task and set(recipe.budgets) == set(BUDGETS)
    if recipe.policy == "gaussian":
        check_ppo_recipe(recipe)
        return
    check_policy(recipe.policy)
    defaults = policy_config(recipe.policy)
    if recipe.task != "outside":
        task = make_task(recipe.task)
        assert recipe_for(recipe.task, recipe.policy).path == path
        assert PipelineConfig(task=recipe.task, policy=recipe.policy).settings() == recipe.settings("quick")
    for budget, settings in recipe.budgets.items():
        config = config_from_dict(type(defaults), {**vars(defaults), **settings.bc_policy}, f"{path.name}: {budget}")
        assert all(
            getattr(config, k) == (tuple(v) if isinstance(v, list) else v) for k, v in settings.bc_policy.items()
        )
        if recipe.task != "outside" and settings.episode_steps is not None:
            assert settings.episode_steps <= task.config.episode_steps or budget == "smoke"
    # the budgets are what their names say: smoke the smallest, standard at least quick's demos and stage steps
    smoke, quick, standard = (recipe.settings(b) for b in ("smoke", "quick", "standard"))
    for name in ("demo_episodes", "bc_steps", "online_total_steps", "distill_steps", "eval_episodes"):
        if getattr(quick, name) == 0:  # a stage the quick budget leaves out
            continue
        assert getattr(smoke, name) <= getattr(quick, name) <= getattr(standard, name), name


def check_ppo_recipe(recipe: Recipe) -> None:
    """A PPO chain's recipe: every budget builds `robotrl train ppo`'s config for its task, and the budgets grow."""
    from robotrl.rl.ppo import PpoConfig
    from robotrl.stages.pipeline import PipelineConfig, ppo_config

    assert PipelineConfig(task=recipe.task).settings() == recipe.settings("quick")
    for budget, settings in recipe.budgets.items():
        assert isinstance(settings, PpoSettings)
        config = ppo_config(PipelineConfig(task=recipe.task, budget=budget), settings, Path("unused"))  # type: ignore[arg-type]
        assert isinstance(config, PpoConfig) and config.total_steps == settings.ppo_total_steps
        assert all(getattr(config, k) == (tuple(v) if isinstance(v, list) else v) for k, v in settings.ppo.items())
    smoke, quick, standard = (recipe.settings(b) for b in ("smoke", "quick", "standard"))
    for name in ("ppo_total_steps", "eval_episodes"):
        assert getattr(smoke, name) <= getattr(quick, name) <= getattr(standard, name), name


def test_a_ppo_recipe_with_a_bad_option_is_refused_in_one_line(tmp_path):
    from robotrl.stages.pipeline import PipelineConfig, ppo_config

    text = (RECIPE_DIR / "Quadruped.yaml").read_text()
    for edit, message in [
        (
            text.replace("rollout_steps: 20", "rollout_stpes: 20"),
            r"Settings.ppo: unknown option\(s\) \['rollout_stpes'\]",
        ),
        (text.replace("epochs: 4\n", "epochs: four\n"), r"Settings.ppo.epochs: expected int, got 'four'"),
        (text.replace("  ppo_num_envs: 64", "  ppo_num_envs: 0"), r"R.yaml: budgets.quick: ppo_num_envs: expected > 0"),
        (text.replace("    eval_every: 0\n", "    seed: 3\n"), r"R.yaml: budgets.quick: ppo: \['seed'\] are the pipe"),
    ]:
        path = tmp_path / "R.yaml"
        path.write_text(edit)
        with pytest.raises(RecipeError, match=message) as info:
            ppo_config(PipelineConfig(task="Quadruped"), load_recipe(path).settings("quick"), tmp_path)  # type: ignore[arg-type]
        assert "\n" not in str(info.value)


def test_a_task_picks_its_recipe():
    assert recipe_for("PickPlace").policy == "flow" and recipe_for("PickPlace", "vla").policy == "vla"
    assert recipe_for("PushT", "flow").path.name == "PushT.yaml"
    assert recipe_for("Reach?robot=example-robot-data:ur5").path.name == "Reach.yaml"  # options: the task's recipe
    assert recipe_for("gym:Hopper-v5").path.name == recipe_for("my_envs:make").path.name == "outside.yaml"
    with pytest.raises(RecipeError, match=r"PipelineConfig.task: expected a task with a recipe, one of .*'PushT'"):
        recipe_for("Walker")


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda t: t.replace("  bc_steps: 6000", "  bc_stpes: 6000"),
            r"R.yaml: budgets.smoke: unknown setting\(s\) \['bc_stpes'\]",
        ),
        (
            lambda t: t.replace("  demo_episodes: 200", "  demo_episodes: many"),
            r"R.yaml: budgets.full: demo_episodes: expected int, got 'many'",
        ),
        (
            lambda t: t.replace("  bc_lr: 1.0e-3", "  bc_lr: -1.0"),
            r"R.yaml: budgets.quick: bc_lr: expected > 0, got -1.0",
        ),
        (
            lambda t: t.replace("  gpu:", "  gpus:"),
            r"R.yaml: budgets: expected \['smoke', 'quick', 'standard', 'gpu', 'full'\]",
        ),
        (
            lambda t: t.replace("  demo_episodes: 200\n", ""),
            r"R.yaml: budgets.full: missing setting\(s\) \['demo_episodes'\]",
        ),
        (lambda t: t + "extra: 1\n", r"R.yaml: unknown key\(s\) \['extra'\]"),
        (lambda t: t.replace("budgets:", "budgets: ["), r"R.yaml: not valid YAML"),
    ],
)
def test_a_broken_recipe_is_refused_in_one_line(tmp_path, edit, message):
    path = tmp_path / "R.yaml"
    path.write_text(edit((RECIPE_DIR / "PushT.yaml").read_text()))
    with pytest.raises(RecipeError, match=message) as info:
        load_recipe(path)
    assert "\n" not in str(info.value)
