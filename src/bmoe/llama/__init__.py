"""The only package that imports llama_cpp or ctypes: every adapter over llama.cpp lives here."""
