"""The course's own tooling, apart from the library: exercise sheets generated from solutions and
the checks they call, offline slide decks, the lesson schedule, and JupyterLab settings for the
lessons.

Needs the ``course`` extra (``pip install packdata[course]``): jupytext, nbclient and nbconvert.
"""
