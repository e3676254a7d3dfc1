"""What a replica is to the cluster: its role in the assignment and its state as its node reports it — the words
the heartbeats and the assignment both speak."""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    ACTIVE = "active"
    STANDBY = "standby"


class ReplicaState(str, Enum):
    RESTORING = "RESTORING"
    ACTIVE = "ACTIVE"
    STANDBY = "STANDBY"
    FAILED = "FAILED"  # its store cannot be written (e.g. the disk is full): never read; its report says why
