"""`chatledger serve` and `chatledger api-key`: the ask service on uvicorn.

The service lives in the `service` package, installed by the extra
`chatledger[serve]`; without it, both commands say how to install it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from chatledger.engine._cli._common import (
    UsageError,
    counted,
    load_agent,
    open_store,
    print_json,
    where,
)

__all__ = ["api_key", "serve", "ui"]

_INSTALL = "The ask service needs its extra: pip install 'chatledger[serve]'."


def serve(args: argparse.Namespace) -> int:
    """Serve the agent named by `--agent` on the database until interrupted."""
    try:
        import uvicorn

        from chatledger.service import ApiKeys, create_app
    except ImportError as error:
        raise UsageError(f"{_INSTALL} ({error})") from error
    agent = load_agent(args.agent)
    keys = ApiKeys.load(args.keys)
    if not len(keys):
        raise UsageError(
            "The key file lists no keys, so no request could be served. Add one with "
            "`chatledger api-key TENANT --keys FILE`."
        )
    store = open_store(args)  # refuses a database that is not migrated, before listening
    url = store.engine.url.render_as_string(hide_password=False)
    print(f"chatledger: serving {args.agent} on {where(store)} for {counted(len(keys), 'API key')}")
    store.close()
    app = create_app(agent, url, keys=keys, replicas=args.replica)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


def ui(args: argparse.Namespace) -> int:
    """Serve the read-only page over the database until interrupted."""
    try:
        import uvicorn

        from chatledger.service import ApiKeys
        from chatledger.service._ui import LOOPBACK, create_ui_app
    except ImportError as error:
        raise UsageError(f"{_INSTALL} ({error})") from error
    if args.host not in LOOPBACK and not args.keys:
        raise UsageError(
            f"--host {args.host} would show tenant {args.tenant!r} to anyone who can reach it: "
            "pass --keys FILE to ask for an API key, or listen on 127.0.0.1."
        )
    keys = ApiKeys.load(args.keys) if args.keys else None
    store = open_store(args)  # refuses a database that is not migrated, before listening
    url = store.engine.url.render_as_string(hide_password=False)
    shown = f"the tenants of {counted(len(keys), 'API key')}" if keys else f"tenant {args.tenant!r}"
    store.close()
    app = create_ui_app(url, tenant=None if keys else args.tenant, keys=keys)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    server = uvicorn.Server(config)
    # The URL is printed once the socket listens, with the port it got (--port 0).
    sockets = [config.bind_socket()]
    sockets[0].listen(config.backlog)  # a request that comes before the server runs waits
    host, port = sockets[0].getsockname()[:2]
    print(f"chatledger: {shown} of {where(store)} at http://{host}:{port}/ui/", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it stopped on
        server.run(sockets=sockets)
    return 0


def api_key(args: argparse.Namespace) -> int:
    """Print a new key for `tenant` once, and its digest entry (added to `--keys`)."""
    try:
        from chatledger.service import key_digest, new_api_key
    except ImportError as error:
        raise UsageError(f"{_INSTALL} ({error})") from error
    if not args.tenant.strip():
        raise UsageError("api-key takes a tenant name, not an empty string.")
    key = new_api_key()
    digest = key_digest(key)
    if args.keys:
        path = Path(args.keys)
        try:
            entries = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, json.JSONDecodeError) as error:
            raise UsageError(f"Cannot read the key file {path}: {error}.") from error
        if not isinstance(entries, dict):
            raise UsageError(f"{path} is not a key file: it must hold a JSON object.")
        entries[digest] = args.tenant
        path.write_text(json.dumps(entries, indent=2) + "\n")
    if args.json:
        print_json({"tenant": args.tenant, "key": key, "digest": digest, "keys": args.keys})
        return 0
    if args.keys:
        print(f"key:   {key}\nadded: {digest} -> {args.tenant} in {args.keys}")
    else:
        print(f"key:   {key}\nentry: {json.dumps({digest: args.tenant})}")
    print("The key is shown once; keep it. The key file holds only its digest.")
    return 0
