"""Supervised fine-tuning on agent trajectories: tokenise with assistant-only loss masks, pack,
train (transformers Trainer on accelerate). Torch and transformers are imported only by the
functions that need them."""

from drvenus.train.launch import LaunchPlan
from drvenus.train.sft.config import SFTConfig, SFTConfigError, load_config
from drvenus.train.sft.data import SFTCollator, SFTDataError, read_conversations, tokenize_dataset
from drvenus.train.sft.launch import plan_launch
from drvenus.train.sft.tokenize import (
    MaskError,
    TokenizedRow,
    TokenizeStats,
    tokenize_conversation,
    tokenize_rows,
)
from drvenus.train.sft.trainer import SFTResult, train

__all__ = [
    "LaunchPlan",
    "MaskError",
    "SFTCollator",
    "SFTConfig",
    "SFTConfigError",
    "SFTDataError",
    "SFTResult",
    "TokenizeStats",
    "TokenizedRow",
    "load_config",
    "plan_launch",
    "read_conversations",
    "tokenize_conversation",
    "tokenize_dataset",
    "tokenize_rows",
    "train",
]
