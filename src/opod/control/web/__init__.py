"""The web beside /api: server-rendered pages (sign-in now; the console and the portal beside it)."""
