"""``llava-normaligned chat``: a local web page that answers questions about an image, streamed, with the image's norms
beside the answer (docs/chat.md): the page (``page``) and what it reads (``readings``); the command is
``llava_normaligned.commands.chat``."""
