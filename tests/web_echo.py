"""A WSGI application that answers the environ it was given as JSON (its str values), behind
portal.serve's filter: what a view would see in request.META under granian
(tests/jobs/test_demo.py)."""

import json


def echo(environ, start_response):
    body = json.dumps({key: value for key, value in environ.items() if isinstance(value, str)}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


def factory():
    from portal.serve import without_process_environment

    return without_process_environment(echo)
