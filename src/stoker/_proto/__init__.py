"""Protobuf modules generated from proto/ by scripts/gen-proto (never edited by hand)."""
