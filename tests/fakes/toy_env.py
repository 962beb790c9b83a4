"""A small AWM-style env whose handlers misbehave on purpose, for runtime fault tests (and the
guard's benchmark)."""

from envfarm import EnvBundle
from envfarm.models import DBSchema, SampleData

CODE = '''
from fastapi import FastAPI, Query, Path, Body, HTTPException
from pydantic import BaseModel, Field
from typing import Optional, List
from sqlalchemy import (
    create_engine,
    Column,
    Integer,
    String,
    ForeignKey,
)
from sqlalchemy.orm import declarative_base, sessionmaker
import os
import asyncio

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/toy.db")
engine = create_engine(
    database_url,
    connect_args={"check_same_thread": False} if database_url.startswith("sqlite") else {},
)
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)
Base = declarative_base()


class Note(Base):
    __tablename__ = "notes"
    id = Column(Integer, primary_key=True)
    title = Column(String, nullable=False)
    owner_id = Column(Integer, ForeignKey("users.id"), nullable=False)


class User(Base):
    __tablename__ = "users"
    id = Column(Integer, primary_key=True)
    name = Column(String, nullable=False)


Base.metadata.create_all(engine)
app = FastAPI(title="Toy", version="1.0.0")


class NoteIn(BaseModel):
    title: str = Field(..., description="Note title.")
    owner_id: int = Field(1, description="Owner user id.")


class NoteOut(BaseModel):
    id: int
    title: str


@app.get("/api/notes", response_model=List[NoteOut], operation_id="list_notes",
         summary="List notes", description="List all notes, optionally filtered by title.")
async def list_notes(q: Optional[str] = Query(None, description="Substring of the title.")):
    session = SessionLocal()
    query = session.query(Note)
    if q:
        query = query.filter(Note.title.like(f"%{q}%"))
    rows = [NoteOut(id=n.id, title=n.title) for n in query.order_by(Note.id).all()]
    session.close()
    return rows


@app.get("/api/notes/{note_id}", response_model=NoteOut, operation_id="get_note", summary="Get a note")
async def get_note(note_id: int = Path(..., description="Note id.")):
    session = SessionLocal()
    n = session.query(Note).filter(Note.id == note_id).first()
    session.close()
    if n is None:
        raise HTTPException(status_code=404, detail=f"note {note_id} not found")
    return NoteOut(id=n.id, title=n.title)


@app.post("/api/notes", response_model=NoteOut, operation_id="create_note", summary="Create a note")
async def create_note(body: NoteIn):
    session = SessionLocal()
    n = Note(title=body.title, owner_id=body.owner_id)
    session.add(n)
    session.commit()
    out = NoteOut(id=n.id, title=n.title)
    session.close()
    return out


@app.post("/api/notes/half", response_model=NoteOut, operation_id="create_then_fail",
          summary="Commits a note, then crashes")
async def create_then_fail(body: NoteIn):
    session = SessionLocal()
    session.add(Note(title=body.title, owner_id=body.owner_id))
    session.commit()
    session.add(Note(title=body.title + " 2", owner_id=body.owner_id))
    session.flush()
    raise RuntimeError("boom after a partial write")


class Rename(BaseModel):
    title: Optional[str] = Field(None, description="New title.")


@app.patch("/api/notes/{note_id}", response_model=NoteOut, operation_id="rename_note",
           summary="Rename a note (optional body)")
async def rename_note(note_id: int = Path(..., description="Note id."),
                      body: Optional[Rename] = Body(None)):
    session = SessionLocal()
    n = session.query(Note).filter(Note.id == note_id).first()
    if body is not None and body.title:
        n.title = body.title
        session.commit()
    out = NoteOut(id=n.id, title=n.title)
    session.close()
    return out


@app.post("/api/notes/sync", response_model=NoteOut, operation_id="create_note_sync",
          summary="Create a note (sync handler)")
def create_note_sync(body: NoteIn):
    session = SessionLocal()
    n = Note(title=body.title, owner_id=body.owner_id)
    session.add(n)
    session.commit()
    out = NoteOut(id=n.id, title=n.title)
    session.close()
    return out


@app.get("/api/bad_response", response_model=NoteOut, operation_id="bad_response",
         summary="Returns something its response_model rejects")
async def bad_response():
    return {"id": "not-a-number", "title": None}


@app.get("/api/spin", operation_id="spin", summary="Loops forever (async)")
async def spin():
    while True:
        pass


@app.get("/api/spin_sync", operation_id="spin_sync", summary="Loops forever (sync)")
def spin_sync():
    x = 0
    while True:
        x += 1


@app.get("/api/hang", operation_id="hang", summary="Awaits forever")
async def hang():
    await asyncio.Event().wait()


@app.get("/api/sleep", operation_id="sleep", summary="Blocks in time.sleep")
async def sleep():
    import time
    time.sleep(30)


@app.get("/api/net", operation_id="net", summary="Opens a socket")
async def net():
    import socket
    socket.create_connection(("127.0.0.1", 9), timeout=1)


@app.get("/api/spawn", operation_id="spawn", summary="Spawns a process")
async def spawn():
    import subprocess
    subprocess.run(["true"])


@app.get("/api/write", operation_id="write_file", summary="Writes a file")
async def write_file(path: str = Query(..., description="Where to write.")):
    with open(path, "w") as fh:
        fh.write("x")


@app.get("/api/leak", operation_id="leak_session", summary="Leaves a transaction open and raises")
async def leak_session():
    session = SessionLocal()
    session.add(Note(title="leaked", owner_id=1))
    session.flush()
    raise ValueError("forgot to close the session")


if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=8000)
'''

SCHEMA = {"tables": [
    {"name": "users", "ddl": "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL);",
     "indexes": []},
    {"name": "notes", "ddl": "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL, "
     "owner_id INTEGER NOT NULL REFERENCES users(id));", "indexes": []},
]}

# Deliberately not in FK order: notes before users.
SAMPLE = {"tables": [
    {"table_name": "notes", "reasoning": "", "insert_statements": [
        "INSERT INTO notes (id, title, owner_id) VALUES (1, 'groceries', 1);",
        "INSERT INTO notes (id, title, owner_id) VALUES (2, 'todo', 2);"]},
    {"table_name": "users", "reasoning": "", "insert_statements": [
        "INSERT INTO users (id, name) VALUES (1, 'ada');",
        "INSERT INTO users (id, name) VALUES (2, 'bob');"]},
]}


def toy_bundle(code: str = CODE) -> EnvBundle:
    """The toy env as a bundle (``code`` replaced, e.g. by a variant that fails to import)."""
    return EnvBundle(name="toy", code=code, db_schema=DBSchema.model_validate(SCHEMA),
                     sample_data=SampleData.model_validate(SAMPLE), tasks=["noop"])
