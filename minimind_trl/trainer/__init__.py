"""Training: recipes and kinds, the GRPO and SFT trainers, their diagnostics, run set-up, the CLI.

The package imports nothing itself; import the module you need (``trainer.run.run_training``,
``trainer.recipe.load_recipe``, ``trainer.grpo_trainer.MiniMindGRPOTrainer``, ...), so that reading
a recipe does not load TRL.
"""
