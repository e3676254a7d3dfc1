"""An in-memory Redis for unit tests: fakeredis, running the real Lua scripts, with a switch that
makes it unreachable (every call then fails as a refused connection would)."""

import fakeredis


class MemoryRedis:
    def __init__(self):
        self.server = fakeredis.FakeServer()
        self.sync = fakeredis.FakeRedis(server=self.server)
        self.aio = fakeredis.FakeAsyncRedis(server=self.server)

    @property
    def down(self):
        return not self.server.connected

    @down.setter
    def down(self, value):
        self.server.connected = not value
