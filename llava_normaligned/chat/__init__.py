"""``llava-normaligned chat``: a local web page that answers questions about an image, streamed, with the image's norms
beside the answer (docs/chat.md). Importing this package imports nothing else: the console script imports
``command`` only when the command runs."""
