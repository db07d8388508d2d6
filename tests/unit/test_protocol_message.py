"""protocol/message.py: one base for the messages of every protocol module."""

from __future__ import annotations

import inspect

from airflow_pgcdc.protocol import frames, pglogical, pgoutput
from airflow_pgcdc.protocol.message import FieldValue, ProtocolMessage


def _classes(module, base):
    return [c for _, c in inspect.getmembers(module, inspect.isclass) if issubclass(c, base) and c is not base]


def test_every_protocol_message_has_the_one_base():
    found = {
        "pgoutput": _classes(pgoutput, pgoutput.Message),
        "pglogical": _classes(pglogical, pglogical.PglogicalMessage),
        "frames": _classes(frames, frames.ReplicationFrame),
    }
    assert set(pgoutput.MESSAGE_CLASSES) <= set(found["pgoutput"])
    assert {pglogical.Startup, pglogical.Begin, pglogical.Relation, pglogical.Insert} <= set(found["pglogical"])
    assert {frames.XLogData, frames.PrimaryKeepalive, frames.StandbyStatusUpdate} <= set(found["frames"])
    for name, classes in found.items():
        for cls in classes:
            assert issubclass(cls, ProtocolMessage), (name, cls)
            assert isinstance(cls.type, str), (name, cls)


def test_the_parts_of_pglogical_messages_compare_by_their_fields():
    assert issubclass(pglogical.Column, FieldValue) and issubclass(pglogical.TupleField, FieldValue)
    assert pglogical.TupleField("t", b"x") == pglogical.TupleField("t", b"x")
    assert pglogical.TupleField("t", b"x") != pglogical.TupleField("t", b"y")
    assert repr(pglogical.NULL_FIELD).startswith("TupleField(")


def test_a_pgoutput_message_encodes_through_the_encoder_hook():
    msg = pgoutput.Insert(None, 16384, ("1", None))
    assert msg.encode(1) == pgoutput.encode_message(msg, 1)
    assert pgoutput.PgoutputDecoder(1).decode(msg.encode(1)) == msg
