"""Medusa-1 and Medusa-2: decoding heads on the target's last hidden state — config, losses, trainer, spec."""
