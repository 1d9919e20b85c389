"""One serializer instance per thread for the API's hot paths (the single-job POST).

DRF deep-copies a serializer's declared fields every time one is built: about 1 ms of Python for
the job's input serializer (20 fields) and as much for its output. ``run_validation`` and
``to_representation`` keep no state on the instance, so an instance built once per thread (gunicorn's
gthread workers run requests on several threads) answers every request of that thread with the
same results and the same errors (``ValidationError`` with the same detail as ``is_valid``)."""

from __future__ import annotations

import threading

_local = threading.local()


def thread_serializer(serializer_class):
    """This thread's instance of ``serializer_class`` (built without data, instance or context)."""
    built = _local.__dict__.setdefault("serializers", {})
    serializer = built.get(serializer_class)
    if serializer is None:
        serializer = built[serializer_class] = serializer_class()
    return serializer


def validated(serializer_class, data) -> dict:
    """``serializer_class(data=data)``'s validated data; raises the ValidationError ``is_valid`` would."""
    return dict(thread_serializer(serializer_class).run_validation(data))


def represented(serializer_class, instance) -> dict:
    """``serializer_class(instance).data``."""
    return thread_serializer(serializer_class).to_representation(instance)
