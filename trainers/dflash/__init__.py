"""DFlash: a block-diffusion draft filling a block of mask tokens in one forward — config, trainer, spec."""
