"""robotrl.hardware — filled in by later issues (see ../shared/DESIGN.md)."""
