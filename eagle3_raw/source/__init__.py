"""The prompt source: files, folders or a Hub dataset, read as conversations in canonical order."""
