"""robotrl.policies — filled in by later issues (see ../shared/DESIGN.md)."""
