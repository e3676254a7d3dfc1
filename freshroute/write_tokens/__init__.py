"""Write tokens: what a writer holds once its input event is in Kafka, handed to a lookup that must include it.

A token names, for each input topic and partition, the offset of the latest event the writer produced (its
producer's delivery report says where it went), and for each table the changelog position of what the session
last read (a lookup's ``position``). Tokens combine: the later offset per partition wins, so one token can carry
"everything I wrote and everything I read". A lookup given one (``after=``) answers only with a value that
reflects those events (:class:`freshroute.write_tokens.read_after.ReadAfter` says how a replica knows).

A token is ``w1.`` + base64url(JSON) + ``.`` + the CRC-32 of that JSON in hex: opaque to its holder, and one cut
or altered in transit is refused rather than read as another. It proves nothing about who wrote the events: a
token names offsets anyone may read.
"""
