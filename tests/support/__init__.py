"""Test support shared across opod's test suites: servers and references that stand in for the outside world.

- :mod:`tests.support.hubserver`: a loopback Hugging Face Hub (file API) with fault injection;
- :mod:`tests.support.llama_server`: start a real ``llama-server`` on a free port for a test;
- :mod:`tests.support.bert_reference`: a numpy BERT forward pass and WordPiece tokenizer,
  the reference that converted embedding models are checked against.
"""
