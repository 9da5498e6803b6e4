"""Bindings of released bugs (peers/history.toml): each module binds one library release's own code as IMPL."""
