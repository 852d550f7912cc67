"""Test helpers shared by several test modules (e.g. the Hub emulator in `hub_server`)."""
