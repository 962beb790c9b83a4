"""A small lending env for the EnvFactory tests: some tools lack response models (so their fields
come from a probe run), one fails every probe, and a second env has no edges at all."""

from __future__ import annotations

from envfarm import EnvBundle
from envfarm.models import DBSchema, SampleData

_HEAD = '''
from typing import List
from fastapi import FastAPI, HTTPException, Path, Query
from pydantic import BaseModel, Field
from sqlalchemy import create_engine, Column, Integer, String, ForeignKey
from sqlalchemy.orm import declarative_base, sessionmaker
import os

database_url = os.getenv("DATABASE_PATH", "sqlite:///outputs/databases/lending.db")
engine = create_engine(database_url, connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(bind=engine, autoflush=False, autocommit=False)
Base = declarative_base()


class Book(Base):
    __tablename__ = "books"
    id = Column(Integer, primary_key=True)
    title = Column(String, nullable=False)
    author = Column(String)


class Loan(Base):
    __tablename__ = "loans"
    id = Column(Integer, primary_key=True)
    book_id = Column(Integer, ForeignKey("books.id"), nullable=False)
    borrower_name = Column(String, nullable=False)
    status = Column(String, nullable=False, default="open")


Base.metadata.create_all(engine)
app = FastAPI(title="Lending", version="1.0.0")


@app.get("/api/ping", operation_id="ping", summary="Ping", description="Say the service is up.")
def ping():
    return {"service": "lending", "version": 1}


@app.get("/api/reports/{year}", operation_id="yearly_report", summary="Yearly report",
         description="Lending report of a year (not implemented: always refuses).")
def yearly_report(year: int = Path(..., description="Report year.")):
    raise HTTPException(status_code=400, detail="reports are not available")
'''

_LENDING = '''

class BookOut(BaseModel):
    id: int = Field(..., description="Book id.")
    title: str = Field(..., description="Book title.")
    author: str | None = Field(None, description="Who wrote it.")


@app.get("/api/books", response_model=List[BookOut], operation_id="list_books", summary="List books",
         description="List every book on the shelf.")
def list_books():
    s = SessionLocal()
    rows = [BookOut(id=b.id, title=b.title, author=b.author) for b in s.query(Book).order_by(Book.id).all()]
    s.close()
    return rows


@app.get("/api/books/{book_id}", response_model=BookOut, operation_id="get_book", summary="Get a book",
         description="One book by id.")
def get_book(book_id: int = Path(..., description="Id of the book.")):
    s = SessionLocal()
    b = s.query(Book).filter(Book.id == book_id).first()
    s.close()
    if b is None:
        raise HTTPException(status_code=404, detail="no such book")
    return BookOut(id=b.id, title=b.title, author=b.author)


@app.post("/api/books/{book_id}/loans", operation_id="lend_book", summary="Lend a book",
          description="Lend a book to a borrower; returns the new loan.")
def lend_book(book_id: int = Path(..., description="Id of the book to lend."),
              borrower_name: str = Query(..., description="Who borrows it.")):
    s = SessionLocal()
    if s.query(Book).filter(Book.id == book_id).first() is None:
        s.close()
        raise HTTPException(status_code=404, detail="no such book")
    loan = Loan(book_id=book_id, borrower_name=borrower_name, status="open")
    s.add(loan)
    s.commit()
    out = {"loan_id": loan.id, "book_id": book_id, "borrower_name": borrower_name, "status": "open"}
    s.close()
    return out


@app.post("/api/loans/{loan_id}/return", operation_id="return_loan", summary="Return a loan",
          description="Mark a loan returned.")
def return_loan(loan_id: int = Path(..., description="Id of the loan.")):
    s = SessionLocal()
    loan = s.query(Loan).filter(Loan.id == loan_id).first()
    if loan is None:
        s.close()
        raise HTTPException(status_code=404, detail="no such loan")
    loan.status = "returned"
    s.commit()
    s.close()
    return {"loan_id": loan_id, "status": "returned"}
'''

_OVERDUE = '''

class LoanRow(BaseModel):
    id: int = Field(..., description="Loan id.")
    book_id: int = Field(..., description="The lent book.")
    borrower_name: str = Field(..., description="Who has it.")


class Overdue(BaseModel):
    overdue: List[LoanRow]


@app.get("/api/loans/overdue", response_model=Overdue, operation_id="list_overdue", summary="Overdue loans",
         description="Every open loan, oldest first.")
def list_overdue():
    s = SessionLocal()
    rows = [LoanRow(id=x.id, book_id=x.book_id, borrower_name=x.borrower_name)
            for x in s.query(Loan).filter(Loan.status == "open").order_by(Loan.id).all()]
    s.close()
    return Overdue(overdue=rows)


@app.post("/api/loans/close", operation_id="close_all_loans", summary="Close all loans",
          description="Mark every open loan returned (end of term).")
def close_all_loans():
    s = SessionLocal()
    n = s.query(Loan).filter(Loan.status == "open").update({"status": "returned"})
    s.commit()
    s.close()
    return {"closed": n}
'''

SCHEMA = {"tables": [
    {"name": "books", "ddl": "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT NOT NULL, author TEXT);", "indexes": []},
    {"name": "loans", "ddl": "CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER NOT NULL "
     "REFERENCES books(id), borrower_name TEXT NOT NULL, status TEXT NOT NULL);", "indexes": []},
]}
SAMPLE = {"tables": [
    {"table_name": "books", "reasoning": "", "insert_statements": [
        "INSERT INTO books (id, title, author) VALUES (1, 'Dune', 'Frank Herbert');",
        "INSERT INTO books (id, title, author) VALUES (2, 'Emma', 'Jane Austen');"]},
    {"table_name": "loans", "reasoning": "", "insert_statements": [
        "INSERT INTO loans (id, book_id, borrower_name, status) VALUES (1, 1, 'Ann', 'open');"]},
]}


def lending_bundle() -> EnvBundle:
    """Tools: ping, yearly_report (fails every probe), list_books, get_book (response models),
    lend_book, return_loan (no response models: probed)."""
    return EnvBundle(name="lending_1", code=_HEAD + _LENDING, db_schema=DBSchema.model_validate(SCHEMA),
                     sample_data=SampleData.model_validate(SAMPLE), tasks=["noop"])


def overdue_bundle() -> EnvBundle:
    """The lending tools plus list_overdue (loan ids under ``overdue[].id``, which the name rule does
    not tie to ``loan_id``) and close_all_loans (no input: isolated without a logical edge)."""
    return EnvBundle(name="overdue_1", code=_HEAD + _LENDING + _OVERDUE, db_schema=DBSchema.model_validate(SCHEMA),
                     sample_data=SampleData.model_validate(SAMPLE), tasks=["noop"])


def no_edges_bundle() -> EnvBundle:
    """Only ping and yearly_report: nothing one returns feeds the other."""
    return EnvBundle(name="no_edges_1", code=_HEAD, db_schema=DBSchema.model_validate(SCHEMA),
                     sample_data=SampleData.model_validate(SAMPLE), tasks=["noop"])
