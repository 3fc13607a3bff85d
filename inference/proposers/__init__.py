"""inference/proposers"""
